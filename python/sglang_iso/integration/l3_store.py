"""L3 storage for the tenant cache's host tier: one file per KV page, named by a secret-keyed MAC.

Why not upstream's storage backends: their page keys are a SHA-256 chain over
tokens seeded only by the client's ``extra_key`` / ``cache_salt`` (token-only
without), and the file backend names files by that hash plus the model path,
shared by every tenant and kept across restarts. Here::

    k_store   = HMAC-SHA-256(namespace secret, "sglang-iso/l3/v1" 0x00 model fingerprint)
    file name = hex(HMAC-SHA-256(k_store, epochs 0x00 namespace id 0x00 page digest)) + ".kv"
    epochs    = the flush counters of all ("*"), of the namespace's owner (tenant) and of the namespace
    contents  = page KV (every buffer's rows, in buffer order) | HMAC-SHA-256(k_store, name | KV)

The namespace id is the verified one (never a client field) and the page digest
chains every token from the namespace root (``HostTier.chain``), so a name is
reachable only by the same namespace with the same prefix; the name reveals no
tenant, prompt hash or model path. A new secret or model fingerprint (model
path, its ``config.json``, KV layout, TP rank) changes ``k_store``: every old
file becomes unreachable. A flush bumps an epoch (kept in an epochs file named by a MAC,
keys MACed too): a tenant flush makes every namespace of that tenant
unreachable, even those not seen since the last restart. A file whose MAC or size does not match is
a miss (counted, fail closed). Files are never trusted for anything but bytes.

Not covered: size limits and pruning of the directory (unreachable files are
harmless; the operator prunes by age), other backends (Mooncake, 3FS, NIXL).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_DOMAIN = b"sglang-iso/l3/v1\x00"
_MAC_BYTES = 32


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
    ) -> None:
        """``owner_of`` maps a namespace to the owner a tenant flush names (its tenant id).

        Raises:
        ValueError: empty secret or ``page_bytes < 1``.
        OSError: the directory cannot be created.
        """
        if not secret or page_bytes < 1:
            raise ValueError("L3 storage needs a namespace secret and a positive page size")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.page_bytes = page_bytes
        self._owner_of = owner_of
        self._key = hmac.new(secret, _DOMAIN + fingerprint, hashlib.sha256).digest()
        self._epochs_path = self.directory / f"epochs-{self._mac(b'epochs').hex()[:32]}.json"
        self._epochs: dict[str, int] = self._load_epochs()
        self.written_pages = 0
        self.read_pages = 0
        self.bad_files = 0

    # ------------------------------------------------------------------------------------------ public API

    def name(self, ns: str, digest: bytes) -> str:
        """File name of ``ns``'s page with prefix digest ``digest`` (hex MAC only)."""
        scopes = ("*", "owner:" + self._owner_of(ns), "ns:" + ns)
        epochs = ",".join(str(self._epochs.get(self._label(scope), 0)) for scope in scopes)
        return self._mac(epochs.encode() + b"\x00" + ns.encode() + b"\x00" + digest).hex() + ".kv"

    def contains(self, ns: str, digest: bytes) -> bool:
        return (self.directory / self.name(ns, digest)).is_file()

    def write(self, ns: str, digest: bytes, payload: bytes) -> bool:
        """Store one page (no-op when present); False when the write failed (logged, never raised)."""
        if len(payload) != self.page_bytes:
            raise ValueError(f"page payload must be {self.page_bytes} bytes, got {len(payload)}")
        name = self.name(ns, digest)
        path = self.directory / name
        if path.is_file():
            return True
        try:
            self._atomic_write(path, payload + self._mac(name.encode() + payload))
        except OSError:
            logger.exception("sglang-iso: L3 page write failed")
            return False
        self.written_pages += 1
        return True

    def read(self, ns: str, digest: bytes) -> bytes | None:
        """One page's KV bytes, or None when absent or not authentic (counted)."""
        name = self.name(ns, digest)
        try:
            data = (self.directory / name).read_bytes()
        except OSError:
            return None
        payload, tag = data[:-_MAC_BYTES], data[-_MAC_BYTES:]
        # SECURITY: fail closed on a wrong size or MAC: a miss, never foreign or corrupted KV.
        if len(payload) != self.page_bytes or not hmac.compare_digest(tag, self._mac(name.encode() + payload)):
            self.bad_files += 1
            logger.warning("isolation-violation op=l3-read file=%s reason=bad size or MAC", name)
            return None
        self.read_pages += 1
        return payload

    def flush(self, scope: str) -> None:
        """Make pages stored so far unreachable (the scope's epoch advances, persisted).

        ``scope``: ``"*"`` (everything), ``"owner:<tenant>"`` or ``"ns:<namespace>"``.
        """
        label = self._label(scope)
        # NOTE: read-modify-write under a lock, because every DP rank (its own process) may flush into the same
        # directory; a lost bump would make flushed pages reachable again after a restart.
        with open(self.directory / ".epochs.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                on_disk = self._load_epochs()
                merged = {k: max(on_disk.get(k, 0), self._epochs.get(k, 0)) for k in {*on_disk, *self._epochs}}
                merged[label] = merged.get(label, 0) + 1
                self._atomic_write(self._epochs_path, json.dumps(merged, sort_keys=True).encode())
                self._epochs = merged
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def status(self) -> dict[str, int]:
        return {
            "l3_written_pages": self.written_pages,
            "l3_read_pages": self.read_pages,
            "l3_bad_files": self.bad_files,
        }

    # ------------------------------------------------------------------------------------------ private

    def _mac(self, msg: bytes) -> bytes:
        return hmac.new(self._key, msg, hashlib.sha256).digest()

    def _label(self, ns: str) -> str:
        return self._mac(b"scope\x00" + ns.encode()).hex()[:32]

    def _load_epochs(self) -> dict[str, int]:
        try:
            raw = json.loads(self._epochs_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # NOTE: fail closed: without the epochs, flushed pages could become reachable again.
            raise RuntimeError(f"sglang-iso: unreadable L3 epochs file {self._epochs_path}: {exc}") from None
        if not isinstance(raw, dict) or not all(isinstance(v, int) for v in raw.values()):
            raise RuntimeError(f"sglang-iso: malformed L3 epochs file {self._epochs_path}")
        return {str(k): int(v) for k, v in raw.items()}

    def _atomic_write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


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
