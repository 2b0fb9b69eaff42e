"""What makes two cached KV prefixes interchangeable, and its unambiguous byte encoding.

A KV prefix may be reused only by a request whose :class:`CacheIdentity` is equal
field for field: same tenant, same weights, same tokenizer, same adapter (and
version), same KV dtype and page size, and the same optional client salt.
:func:`encode_identity` turns an identity into bytes that are injective: two
different identities never encode to the same bytes, so an HMAC over the
encoding (see :mod:`sglang_iso.identity.namespace`) never collides by
construction of the input.

Wire format (version 1), every integer big-endian::

    tag_len:u32 | tag | version:u16 | n_fields:u16 | field_1 | ... | field_n

    required str field  :  len:u32 | utf-8 bytes
    optional str field  :  0x00                      (None)
                        |  0x01 | len:u32 | bytes    (present, possibly "")
    int field           :  8 bytes, signed

The explicit presence byte makes ``None`` and ``""`` different; the length
prefixes make ``("a", "bc")`` and ``("ab", "c")`` different.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sglang_iso.names import TENANT_ID_PATTERN

IDENTITY_DOMAIN_TAG = b"sglang-iso/cache-identity"
"""Domain-separation tag of :func:`encode_identity`; never reused for another encoding."""

ENCODING_VERSION = 1
"""Bumped whenever the wire format or the field list changes."""


_MAX_FIELD_BYTES = 2**32 - 1


@dataclass(frozen=True)
class CacheIdentity:
    """Everything that must be equal for two requests to share cached KV.

    Immutable; validated at construction (raises ``ValueError`` naming the field).
    """

    tenant_id: str
    """Tenant that owns the cache entries; matches :data:`TENANT_ID_PATTERN`."""
    model_fingerprint: str
    """Hash of the served weights (non-empty)."""
    tokenizer_fingerprint: str
    """Hash of the tokenizer and chat template (non-empty)."""
    adapter_id: str | None
    """LoRA/adapter name, or None for the base model."""
    adapter_version: str | None
    """Adapter revision, or None when unversioned / no adapter."""
    kv_dtype: str
    """KV cache storage dtype, e.g. ``"bfloat16"`` or ``"fp8_e4m3"`` (non-empty)."""
    page_size: int
    """KV pool page size in tokens (>= 1)."""
    cache_salt: str | None = None
    """Client's optional sub-namespace inside its tenant; None and "" are different salts."""

    def __post_init__(self) -> None:
        if not isinstance(self.tenant_id, str) or TENANT_ID_PATTERN.fullmatch(self.tenant_id) is None:
            raise ValueError(f"tenant_id must match {TENANT_ID_PATTERN.pattern!r}, got {self.tenant_id!r}")
        for name in ("model_fingerprint", "tokenizer_fingerprint", "kv_dtype"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str, got {value!r}")
        for name in ("adapter_id", "adapter_version", "cache_salt"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a str or None, got {type(value).__name__}")
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"page_size must be an int >= 1, got {self.page_size!r}")


def encode_identity(identity: CacheIdentity) -> bytes:
    """Injective byte encoding of every field of ``identity`` (see the module docstring)."""
    fields: list[str | int | None] = [identity.tenant_id, *kv_fields(identity), identity.cache_salt]
    optional = {3, 4, 7}
    return encode_fields(IDENTITY_DOMAIN_TAG, fields, optional)


def kv_fields(identity: CacheIdentity) -> list[str | int | None]:
    """The fields that determine the KV bytes, in wire order: model, tokenizer, adapter id and version (both
    optional), KV dtype, page size."""
    return [
        identity.model_fingerprint,
        identity.tokenizer_fingerprint,
        identity.adapter_id,
        identity.adapter_version,
        identity.kv_dtype,
        identity.page_size,
    ]


def encode_fields(domain_tag: bytes, fields: list[str | int | None], optional: set[int]) -> bytes:
    """Frame ``fields`` under ``domain_tag`` in the version-1 wire format.

    ``optional`` holds the positions of fields that get a presence byte. Shared by
    every identity-derived encoding so each differs only in its tag and field list.

    Raises:
        ValueError: a required field is None, or a field does not fit a u32 length.
    """
    out = bytearray()
    out += _framed(domain_tag)
    out += struct.pack(">HH", ENCODING_VERSION, len(fields))
    for pos, value in enumerate(fields):
        if pos in optional:
            if value is None:
                out += b"\x00"
                continue
            out += b"\x01"
        if value is None:
            raise ValueError(f"field {pos} is required but is None")
        if isinstance(value, int):
            out += struct.pack(">q", value)
        else:
            out += _framed(value.encode("utf-8"))
    return bytes(out)


def _framed(data: bytes) -> bytes:
    if len(data) > _MAX_FIELD_BYTES:
        raise ValueError(f"field too long for a u32 length prefix: {len(data)=}")
    return struct.pack(">I", len(data)) + data
