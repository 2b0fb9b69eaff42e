"""LoRA adapters per tenant: which adapters a request names, whether its tenant may use them, and
what identifies an adapter's weights in the cache identity.

A tenant may use only the adapters its tenants-file entry lists (``adapters = [...]``;
none by default). Requests name adapters in ``lora_path`` (a name or a list of
names, one per prompt; ``None`` entries mean the base model), in the OpenAI
``model`` field (``"<served model>:<adapter>"``, resolved by SGLang into
``lora_path`` before the front-end hook sees it), or, upstream, by an internal
``lora_id``, which tenants may never send. The check runs twice: at the HTTP gate
on the JSON body (:func:`check_body`), and in the front end on the resolved
request (:func:`refused_adapter`), which also covers the ``model`` form.

An adapter's cache identity is its name plus :func:`content_hash` of its files,
so a re-upload under the same name never matches KV computed with the old weights.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NamedTuple

ADAPTER_FIELD = "lora_path"
"""The request field that names adapters."""
INTERNAL_ID_FIELD = "lora_id"
"""SGLang's internal adapter id: server-assigned, never accepted from a tenant."""

_HASH_DOMAIN = b"sglang-iso/adapter-content/v1"
_CHUNK = 1 << 20


class AdapterRefusal(NamedTuple):
    """Why a request's adapter fields were refused."""

    field: str
    """The request field at fault (``lora_path`` or ``lora_id``)."""
    reason: str
    """Human-readable reason; names the adapter, never another tenant."""
    status: int
    """HTTP status: 403 for an adapter the tenant may not use, 400 for a malformed field."""
    code: str
    """Machine-readable error code."""


def check_body(allowed: Collection[str], body: Mapping[str, Any]) -> AdapterRefusal | None:
    """Check a request body's adapter fields against the tenant's ``allowed`` adapter names.

    Pure: reads ``body`` only. Returns None when every named adapter is allowed
    (or none is named).
    """
    if body.get(INTERNAL_ID_FIELD) is not None:
        return AdapterRefusal(
            INTERNAL_ID_FIELD, "adapter ids are assigned by the server; name the adapter in lora_path", 400,
            "forbidden_field",
        )  # fmt: skip
    names = adapter_names(body.get(ADAPTER_FIELD))
    if names is None:
        return AdapterRefusal(ADAPTER_FIELD, "must be a string, or a list of strings and nulls", 400, "invalid_field")
    return refused_adapter(allowed, names)


def refused_adapter(allowed: Collection[str], names: Collection[str]) -> AdapterRefusal | None:
    """The refusal for the first of ``names`` not in ``allowed``, or None."""
    for name in names:
        if name not in allowed:
            return AdapterRefusal(
                ADAPTER_FIELD, f"adapter {name!r} is not available to this API key", 403, "adapter_not_allowed"
            )
    return None


def adapter_names(value: object) -> list[str] | None:
    """The adapter names in a ``lora_path`` value (deduplicated, in order); None if malformed.

    ``None`` and ``""`` mean the base model (SGLang treats an empty name as none).
    """
    if value is None or value == "":
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(item is None or isinstance(item, str) for item in items):
        return None
    return list(dict.fromkeys(item for item in items if item))


def content_hash(path: str | None) -> str | None:
    """SHA-256 over the regular files directly in adapter directory ``path`` (names and bytes, sorted).

    Covers ``adapter_config.json`` and the weights whatever their format.
    Returns None when ``path`` is not a readable directory holding a file (e.g. a
    hub id or an adapter loaded from tensors); the caller must then not share.
    """
    if not path:
        return None
    folder = Path(path)
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        if not files:
            return None
        h = hashlib.sha256(_HASH_DOMAIN)
        for file in files:
            name = file.name.encode("utf-8", errors="surrogateescape")
            h.update(len(name).to_bytes(4, "big") + name + file.stat().st_size.to_bytes(8, "big"))
            with file.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def tensors_hash(config: object, serialized_tensors: object) -> str | None:
    """SHA-256 over an adapter sent as tensors: its config (canonical JSON) and each serialized tensor copy.

    Returns None when the inputs are not a JSON-serializable config and a list of bytes.
    """
    if not isinstance(serialized_tensors, list) or not all(isinstance(b, bytes) for b in serialized_tensors):
        return None
    try:
        config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        return None
    h = hashlib.sha256(_HASH_DOMAIN + b"/tensors")
    for part in (config_bytes, *serialized_tensors):
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()


class AdapterVersions:
    """Load id (SGLang's ``lora_id``) -> content hash of the files it was loaded from, or ``unhashed:<lora_id>``.

    One per HTTP process, owned by its front-end state
    (:attr:`sglang_iso.integration.front.state.FrontState.adapter_versions`). Mutated on the event loop by the
    load and unload hooks and by the first request naming a startup adapter.
    """

    def __init__(self) -> None:
        self._by_load: dict[str, str] = {}

    def of(self, lora_id: str, path: str | None) -> str:
        """The version recorded for load ``lora_id`` (hashing ``path`` now if none was recorded)."""
        version = self._by_load.get(lora_id)
        if version is None:
            # NOTE: startup adapters (--lora-paths) were loaded before any hook ran; hash them on first use.
            version = self.record(lora_id, content_hash(path))
        return version

    def record(self, lora_id: str, content: str | None) -> str:
        """Load ``lora_id`` read ``content`` (None: no stable content, a per-load identity); returns the version."""
        version = self._by_load[lora_id] = content or f"unhashed:{lora_id}"
        return version

    def forget(self, lora_id: str) -> None:
        """Load ``lora_id`` was unloaded."""
        self._by_load.pop(lora_id, None)
