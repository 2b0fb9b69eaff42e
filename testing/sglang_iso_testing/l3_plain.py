"""Test plugin for benchmarks: L3 page files in plaintext with a MAC, to measure what encryption at rest costs.

Loaded by ``benchmark/hicache_l3.py`` into the plaintext server only (``SGLANG_ISO_TEST_PLUGINS``, with the
testing switch), never into a production server (the launcher refuses test plugins without it). It replaces the
L3 store's per-owner AEAD with a MAC-only stand-in of the same shape (same key schedule input, same 16-byte tag,
same file size): the page bytes are written as they are and authenticated with HMAC-SHA-256 over nonce,
associated data and payload, which is what the store did before encryption at rest. Everything else (names,
headers, epochs, the atomic write) is the store's own, so the two servers differ by the cipher alone.
"""

from __future__ import annotations

import hashlib
import hmac
import logging

from cryptography.exceptions import InvalidTag

logger = logging.getLogger(__name__)

_TAG_BYTES = 16


class MacOnly:
    """``AESGCM``'s ``encrypt``/``decrypt`` without the encryption: payload, then a truncated HMAC tag."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _tag(self, nonce: bytes, data: bytes, aad: bytes | None) -> bytes:
        msg = len(nonce).to_bytes(2, "big") + nonce + len(aad or b"").to_bytes(4, "big") + (aad or b"") + data
        return hmac.new(self._key, msg, hashlib.sha256).digest()[:_TAG_BYTES]

    def encrypt(self, nonce: bytes, data: bytes, associated_data: bytes | None) -> bytes:
        return data + self._tag(nonce, data, associated_data)

    def decrypt(self, nonce: bytes, data: bytes, associated_data: bytes | None) -> bytes:
        body, tag = data[:-_TAG_BYTES], data[-_TAG_BYTES:]
        if len(data) < _TAG_BYTES or not hmac.compare_digest(tag, self._tag(nonce, body, associated_data)):
            raise InvalidTag()
        return body


def register() -> None:
    from sglang_iso.integration.l3_store import FileL3Store

    def plain_cipher(store: FileL3Store, owner_label: str, epochs: tuple[int, int, int]) -> MacOnly:
        key = store._mac(b"plain\x00" + owner_label.encode() + repr(epochs).encode())
        return MacOnly(key)

    FileL3Store._cipher = plain_cipher  # type: ignore[assignment, method-assign]
    logger.warning("sglang-iso: TEST L3 pages are written in plaintext (MAC only): benchmark use only")
