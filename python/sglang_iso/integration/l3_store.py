"""L3 storage for the tenant cache's host tier: one encrypted file per KV page, named by a secret-keyed MAC.

Why not upstream's storage backends: their page keys are a SHA-256 chain over
tokens seeded only by the client's ``extra_key`` / ``cache_salt`` (token-only
without), and the file backend names files by that hash plus the model path,
shared by every tenant and kept across restarts. Here::

    k_store   = HMAC-SHA-256(namespace secret, "sglang-iso/l3/v3" 0x00 model fingerprint)
    file name = hex(HMAC-SHA-256(k_store, epochs 0x00 namespace id 0x00 page digest)) + ".kv"
    epochs    = the flush counters of all ("*"), of the namespace's owner (tenant) and of the namespace
    contents  = header | nonce | AES-256-GCM(k_owner, nonce, page KV, associated data = name | header)
    k_owner   = HKDF-SHA-256(k_store, info = "sglang-iso/l3/aead" 0x00 owner label 0x00 epochs | salts)
    salts     = the random salts of the current epochs of all ("*") and of the owner, kept only in the epochs file
    header    = owner label | namespace label | epochs | HMAC(k_store, name | ...)[:16]   (labels: MACs, hex)
    nonce     = 12 random bytes per file; page KV = every buffer's rows of the page, in buffer order

Encryption at rest: whoever reads the directory (a shared mount, a backup,
another node) sees no KV, which inverts back to the prompt; each tenant's pages
are under its own key, which a flush of the tenant or of everything replaces
(the epochs are part of it). The associated data binds a file to its name and
header: a file copied to another name, another tenant's or an older epoch's, or
with any byte changed, fails authentication and is a counted miss.

The namespace id is the verified one (never a client field) and the page digest
chains every token from the namespace root (``HostTier.chain``), so a name is
reachable only by the same namespace with the same prefix; neither the name nor
the header reveals a tenant, prompt hash or model path (files of one owner do
share its label). A new secret or model fingerprint (model path, its
``config.json``, KV layout, TP rank) changes ``k_store``: every old file becomes
unreachable. A flush bumps an epoch (kept in an epochs file named by a MAC, keys
MACed too) and deletes the flushed files this store knows: a tenant flush makes
every namespace of that tenant unreachable, even those not seen since the last
restart. A file whose MAC or size does not match is a miss (counted, fail
closed). Files are never trusted for anything but bytes.

Residency (:class:`sglang_iso.cache.l3_index.L3Index`): at start the store reads
every file's header (not its KV) and indexes the files it can authenticate, least
recently used first (by mtime; a read refreshes it); files of an older epoch are
deleted then (unreachable anyway). Before a write, an owner at its L3 quota loses
its own least recently used files, and a store at its overall cap loses the least
recently used files of anyone. Files it cannot authenticate (another secret, model,
TP rank or format) are never read, counted or deleted: the operator removes them.
With several DP ranks over one directory each rank enforces the caps over the files
it indexed (those present at its start and its own writes).

Storage faults fail closed and never stop the scheduler. A page file is written to a temporary name and
renamed, so a process killed mid-write leaves no half file under a page name, only a ``.tmp-`` file, removed
at the next start once older than a minute (another rank's may be in progress); a page torn by a power loss
fails authentication (a miss). A failed write (disk full, read-only, I/O error) stores nothing and is counted
(``l3_write_failures``). The epochs file is synced before its rename. A flush whose new epoch cannot be
persisted still takes effect in this process (the epoch advances in memory, the scope's files are deleted) and is
counted (``l3_epoch_write_failures``): after a restart, pages written under the unpersisted epoch are stale
and deleted.

Not covered: other backends (Mooncake, 3FS, NIXL).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from sglang_iso.cache.l3_index import L3Index

logger = logging.getLogger(__name__)

_DOMAIN = b"sglang-iso/l3/v3\x00"
_AEAD_INFO = b"sglang-iso/l3/aead\x00"
_NONCE_BYTES = 12
_AEAD_TAG_BYTES = 16
_LABEL_CHARS = 32
_EPOCHS = struct.Struct(">QQQ")
_HEADER_TAG_BYTES = 16
_TMP_PREFIX = ".tmp-"
_PARTIAL_AGE_S = 60.0  # NOTE: a temporary file older than this is a killed writer's, not another rank's in progress
HEADER_BYTES = 2 * _LABEL_CHARS + _EPOCHS.size + _HEADER_TAG_BYTES
"""Bytes before a file's KV: owner label, namespace label, epochs, header tag."""


def model_fingerprint(model_path: str, layout: str) -> bytes:
    """Bytes that change when the model or KV layout changes: path, ``config.json`` contents, ``layout``."""
    h = hashlib.sha256(model_path.encode() + b"\x00" + layout.encode() + b"\x00")
    config = Path(model_path) / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    return h.digest()


class FileL3Store:
    """Page files in one directory. Not thread-safe; call from the scheduler thread."""

    def __init__(
        self,
        directory: str | Path,
        secret: bytes,
        fingerprint: bytes,
        page_bytes: int,
        owner_of: Callable[[str], str] = lambda ns: ns,
        max_bytes: int | None = None,
    ) -> None:
        """``owner_of`` maps a namespace to the owner a tenant flush and an L3 quota name (its tenant id);
        ``max_bytes`` caps the files this store keeps (None: no cap but the disk).

        Raises:
        ValueError: empty secret, ``page_bytes < 1`` or ``max_bytes`` smaller than one file.
        OSError: the directory cannot be created.
        RuntimeError: the epochs file is unreadable.
        """
        if not secret or page_bytes < 1:
            raise ValueError("L3 storage needs a namespace secret and a positive page size")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.page_bytes = page_bytes
        self.file_bytes = HEADER_BYTES + _NONCE_BYTES + page_bytes + _AEAD_TAG_BYTES
        if max_bytes is not None and max_bytes < self.file_bytes:
            raise ValueError(f"L3 max size {max_bytes} bytes is smaller than one page file ({self.file_bytes} bytes)")
        self._owner_of = owner_of
        self._key = hmac.new(secret, _DOMAIN + fingerprint, hashlib.sha256).digest()
        self._ciphers: dict[tuple[str, tuple[int, int, int]], AESGCM] = {}  # (owner label, epochs) -> its AEAD
        self._epochs_path = self.directory / f"epochs-{self._mac(b'epochs').hex()[:32]}.json"
        self._epochs: dict[str, tuple[int, str]] = self._load_epochs()  # label -> (epoch, its salt, hex)
        self.index = L3Index(None if max_bytes is None else max_bytes // self.file_bytes)
        self.written_pages = 0
        self.read_pages = 0
        self.bad_files = 0
        self.stale_removed = 0
        self.foreign_files = 0
        self.write_failures = 0
        self.epoch_write_failures = 0
        self.partial_removed = 0
        self._scan()
        self._delete(self.index.over_cap(), pruned=True)

    # ------------------------------------------------------------------------------------------ public API

    def name(self, ns: str, digest: bytes) -> str:
        """File name of ``ns``'s page with prefix digest ``digest`` (hex MAC only)."""
        epochs = ",".join(str(e) for e in self._current_epochs(self.owner_label(ns), self._label("ns:" + ns)))
        return self._mac(epochs.encode() + b"\x00" + ns.encode() + b"\x00" + digest).hex() + ".kv"

    def contains(self, ns: str, digest: bytes) -> bool:
        return (self.directory / self.name(ns, digest)).is_file()

    def write(self, ns: str, digest: bytes, payload: bytes) -> bool:
        """Store one page (no-op when present), first pruning what the caps require; False when nothing was
        stored (the owner's L3 quota is 0 pages, or the write failed: logged, never raised)."""
        if len(payload) != self.page_bytes:
            raise ValueError(f"page payload must be {self.page_bytes} bytes, got {len(payload)}")
        name = self.name(ns, digest)
        path = self.directory / name
        owner, ns_label = self.owner_label(ns), self._label("ns:" + ns)
        if name in self.index or path.is_file():
            self.index.add(name, owner, ns_label)
            return True
        victims = self.index.admit(owner)
        if victims is None:
            return False
        self._delete(victims, pruned=True)
        try:
            self._salted(self._label("*"), owner)
        except OSError as exc:
            self.write_failures += 1
            logger.error("sglang-iso: L3 epochs file write failed, page not stored: %s", exc)
            return False
        epochs = self._current_epochs(owner, ns_label)
        body = owner.encode() + ns_label.encode() + _EPOCHS.pack(*epochs)
        header = body + self._mac(b"header\x00" + name.encode() + body)[:_HEADER_TAG_BYTES]
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._cipher(owner, epochs).encrypt(nonce, payload, name.encode() + header)
        try:
            self._atomic_write(path, header + nonce + sealed)
        except OSError as exc:
            self.write_failures += 1
            logger.error("sglang-iso: L3 page write failed, page not stored: %s", exc)
            return False
        self.index.add(name, owner, ns_label)
        self.written_pages += 1
        return True

    def read(self, ns: str, digest: bytes) -> bytes | None:
        """One page's KV bytes, or None when absent or not authentic (counted)."""
        name = self.name(ns, digest)
        path = self.directory / name
        try:
            data = path.read_bytes()
        except OSError:
            self.index.remove(name)  # NOTE: another rank over the same directory may have pruned it
            return None
        header, nonce = data[:HEADER_BYTES], data[HEADER_BYTES : HEADER_BYTES + _NONCE_BYTES]
        owner, ns_label = self.owner_label(ns), self._label("ns:" + ns)
        # SECURITY: fail closed on a wrong size or a failed authentication (another name, header, tenant key or
        # epoch, or any changed byte): a miss, never foreign or corrupted KV. The key is the one this namespace's
        # owner has now, never one the file's header names.
        payload = None
        if len(data) == self.file_bytes:
            try:
                cipher = self._cipher(owner, self._current_epochs(owner, ns_label))
                payload = cipher.decrypt(nonce, data[HEADER_BYTES + _NONCE_BYTES :], name.encode() + header)
            except InvalidTag:
                payload = None
        if payload is None:
            self.bad_files += 1
            logger.warning("isolation-violation op=l3-read file=%s reason=bad size or authentication", name)
            return None
        self.read_pages += 1
        self.index.touch(name)
        with contextlib.suppress(OSError):
            os.utime(path)  # NOTE: the mtime orders files at the next start (least recently used first)
        return payload

    def flush(self, scope: str) -> int:
        """Make pages stored so far unreachable (the scope's epoch advances, persisted) and delete the files of
        the scope this store knows; returns files deleted.

        ``scope``: ``"*"`` (everything), ``"owner:<tenant>"`` or ``"ns:<namespace>"``.
        """
        label = self._label(scope)

        def bump(merged: dict[str, tuple[int, str]]) -> None:
            # SECURITY: the old epoch's salt is overwritten: its files cannot be decrypted any more.
            merged[label] = (merged.get(label, (0, ""))[0] + 1, _salt())

        try:
            self._update_epochs(bump)
        except OSError as exc:
            # NOTE: the flush still holds in this process: the epoch advances in memory (names and keys change),
            # the scope's files are deleted below; a page written under this epoch is stale after a restart.
            self.epoch_write_failures += 1
            logger.error("sglang-iso: L3 flush of %s not persisted (epochs file write failed): %s", scope[:6], exc)
            bump(self._epochs)
            self._ciphers.clear()
        if scope == "*":
            names = self.index.drop_all()
        elif scope.startswith("owner:"):
            names = self.index.drop_owner(label)
        else:
            names = self.index.drop_namespace(label)
        self._delete(names, pruned=False)
        return len(names)

    def set_quota(self, owner: str, pages: int | None) -> int:
        """Cap ``owner``'s stored pages (None: only the overall cap); its LRU files above it are deleted now.
        Returns files deleted."""
        victims = self.index.set_quota(self._label("owner:" + owner), pages)
        self._delete(victims, pruned=True)
        return len(victims)

    def owner_label(self, ns: str) -> str:
        """The label of ``ns``'s owner in headers and the index (a MAC: no tenant id in clear)."""
        return self._label("owner:" + self._owner_of(ns))

    def owner_stats(self, owner: str) -> dict[str, int]:
        """Stored and pruned pages of ``owner`` (a tenant id, as ``owner_of`` gives it)."""
        label = self._label("owner:" + owner)
        return {
            "l3_resident_pages": self.index.resident_pages(label),
            "l3_pruned_pages": self.index.pruned_pages.get(label, 0),
        }

    def status(self) -> dict[str, int]:
        return {
            "l3_written_pages": self.written_pages,
            "l3_read_pages": self.read_pages,
            "l3_bad_files": self.bad_files,
            "l3_resident_pages": len(self.index),
            "l3_max_pages": self.index.max_pages or 0,
            "l3_pruned_pages": sum(self.index.pruned_pages.values()),
            "l3_stale_removed": self.stale_removed,
            "l3_foreign_files": self.foreign_files,
            "l3_write_failures": self.write_failures,
            "l3_epoch_write_failures": self.epoch_write_failures,
            "l3_partial_removed": self.partial_removed,
        }

    # ------------------------------------------------------------------------------------------ private

    def _update_epochs(self, change: Callable[[dict[str, tuple[int, str]]], None]) -> None:
        """Apply ``change`` to the epochs merged from the file and this store, and persist them."""
        # NOTE: read-modify-write under a lock, because every DP rank (its own process) may flush into the same
        # directory; a lost bump would make flushed pages reachable again after a restart.
        with open(self.directory / ".epochs.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                on_disk = self._load_epochs()
                merged = {
                    k: max(on_disk.get(k, (0, "")), self._epochs.get(k, (0, "")), key=lambda entry: entry[0])
                    for k in {*on_disk, *self._epochs}
                }
                change(merged)
                text = json.dumps({k: list(v) for k, v in merged.items()}, sort_keys=True)
                self._atomic_write(self._epochs_path, text.encode(), durable=True)
                self._epochs = merged
                self._ciphers.clear()  # NOTE: keys of the old epochs are never needed again
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _salted(self, *labels: str) -> None:
        """Give each label without an epoch entry its first one (epoch 0, a random salt), persisted: the keys of
        its first epoch must be shreddable too."""
        if all(label in self._epochs for label in labels):
            return

        def add(merged: dict[str, tuple[int, str]]) -> None:
            for label in labels:
                merged.setdefault(label, (0, _salt()))

        self._update_epochs(add)

    def _mac(self, msg: bytes) -> bytes:
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    def _cipher(self, owner_label: str, epochs: tuple[int, int, int]) -> AESGCM:
        """The AEAD of ``owner_label``'s pages at ``epochs`` (derived once, then kept)."""
        found = self._ciphers.get((owner_label, epochs))
        if found is None:
            salts = self._epochs.get(self._label("*"), (0, ""))[1] + "," + self._epochs.get(owner_label, (0, ""))[1]
            info = _AEAD_INFO + owner_label.encode() + b"\x00" + _EPOCHS.pack(*epochs) + salts.encode()
            key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(self._key)
            found = self._ciphers[(owner_label, epochs)] = AESGCM(key)
        return found

    def _label(self, scope: str) -> str:
        return self._mac(b"scope\x00" + scope.encode()).hex()[:_LABEL_CHARS]

    def _current_epochs(self, owner_label: str, ns_label: str) -> tuple[int, int, int]:
        epochs = self._epochs
        return (
            epochs.get(self._label("*"), (0, ""))[0],
            epochs.get(owner_label, (0, ""))[0],
            epochs.get(ns_label, (0, ""))[0],
        )

    def _scan(self) -> None:
        """Index the files this store can authenticate, oldest mtime first; delete those of an older epoch and
        temporary files a killed writer left."""
        cutoff = time.time() - _PARTIAL_AGE_S
        for path in self.directory.glob(_TMP_PREFIX + "*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    self.partial_removed += 1
        found: list[tuple[int, str, str, str]] = []
        for path in self.directory.glob("*.kv"):
            try:
                st = path.stat()
                size, mtime = st.st_size, st.st_mtime_ns
                with open(path, "rb") as f:
                    head = f.read(HEADER_BYTES)
            except OSError:
                continue
            body, tag = head[:-_HEADER_TAG_BYTES], head[-_HEADER_TAG_BYTES:]
            expected = self._mac(b"header\x00" + path.name.encode() + body)[:_HEADER_TAG_BYTES]
            if size != self.file_bytes or len(head) != HEADER_BYTES or not hmac.compare_digest(tag, expected):
                self.foreign_files += 1
                continue
            owner = body[:_LABEL_CHARS].decode("ascii", "replace")
            ns_label = body[_LABEL_CHARS : 2 * _LABEL_CHARS].decode("ascii", "replace")
            if _EPOCHS.unpack(body[2 * _LABEL_CHARS :]) != self._current_epochs(owner, ns_label):
                path.unlink(missing_ok=True)  # flushed: unreachable by name already
                self.stale_removed += 1
                continue
            found.append((mtime, path.name, owner, ns_label))
        for _, name, owner, ns_label in sorted(found):
            self.index.add(name, owner, ns_label)

    def _delete(self, names: list[str], *, pruned: bool) -> None:
        for name in names:
            try:
                (self.directory / name).unlink(missing_ok=True)
            except OSError:
                logger.exception("sglang-iso: L3 page delete failed")
            self.index.remove(name, pruned=pruned)

    def _load_epochs(self) -> dict[str, tuple[int, str]]:
        try:
            raw = json.loads(self._epochs_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # NOTE: fail closed: without the epochs, flushed pages could become reachable again.
            raise RuntimeError(f"sglang-iso: unreadable L3 epochs file {self._epochs_path}: {exc}") from None
        if not isinstance(raw, dict) or not all(_is_epoch_entry(v) for v in raw.values()):
            raise RuntimeError(f"sglang-iso: malformed L3 epochs file {self._epochs_path}")
        return {str(k): (int(v[0]), str(v[1])) for k, v in raw.items()}

    def _atomic_write(self, path: Path, data: bytes, *, durable: bool = False) -> None:
        """Write ``data`` under a temporary name, then rename it to ``path``; ``durable`` syncs the file before
        the rename and the directory after it (the epochs file: a lost bump would make flushed pages readable).

        Raises:
            OSError: the write or the rename failed; nothing is left under ``path``'s name or a temporary one.
        """
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=_TMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if durable:
            directory = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)


def _salt() -> str:
    return os.urandom(16).hex()


def _is_epoch_entry(value: object) -> bool:
    """``[epoch, salt hex]`` as the epochs file keeps it."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], int)
        and isinstance(value[1], str)
        and all(c in "0123456789abcdef" for c in value[1])
    )


def page_payload(buffers: list[torch.Tensor], slots: torch.Tensor) -> bytes:
    """The KV of ``slots`` (one page) from every buffer, as bytes in buffer order."""
    return b"".join(
        buf.index_select(0, slots).to("cpu").contiguous().view(torch.uint8).numpy().tobytes() for buf in buffers
    )


def payload_rows(buffers: list[torch.Tensor], payload: bytes, page_size: int) -> list[torch.Tensor]:
    """Inverse of :func:`page_payload`: one ``[page_size, ...]`` CPU tensor per buffer."""
    out = []
    offset = 0
    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    for buf in buffers:
        n = page_size * buf[0].numel() * buf.element_size()
        out.append(raw[offset : offset + n].view(buf.dtype).view(page_size, *buf.shape[1:]))
        offset += n
    return out
