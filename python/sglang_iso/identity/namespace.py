"""Keyed namespace ids: HMAC-SHA-256 of an encoded :class:`CacheIdentity`.

The prefix cache partitions entries by these ids. They are keyed with an
operator secret so that a client who knows another tenant's identity fields
still cannot compute (or guess) that tenant's namespace id, and so ids leak
nothing when logged.

Used by the front end only (:class:`~sglang_iso.server.tagging.NamespaceTagger`):
it computes :meth:`NamespaceKeyer.namespace_id` of the request's identity (owner,
model, tokenizer, adapter and its version, KV dtype, page size, client salt) and
writes it, with the owner and a MAC, into the request's namespace tag
(:mod:`sglang_iso.identity.tags`). The scheduler never recomputes it: it checks the
tag's MAC and makes a :class:`~sglang_iso.identity.tags.Namespace` whose key,
``t:<owner>:<namespace id>``, is the tree namespace. Per-tenant
quotas and flushes go by the owner in the tag; the scope a shared prefix is valid
in is the server's model (one per adapter load for LoRA namespaces), set by the
tenant cache, not derived here.
"""

from __future__ import annotations

import hashlib
import hmac

from sglang_iso.constants import MIN_SECRET_BYTES
from sglang_iso.identity.cache_identity import CacheIdentity, encode_identity


class NamespaceKeyer:
    """Derives keyed ids from identities. Holds the secret; never mutates after construction."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        """Raises ``ValueError`` if ``secret`` is not bytes of at least :data:`MIN_SECRET_BYTES`."""
        if not isinstance(secret, bytes | bytearray):
            raise ValueError(f"secret must be bytes, got {type(secret).__name__}")
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
        self._secret = bytes(secret)

    def __repr__(self) -> str:
        # NOTE: never print the secret, because reprs end up in logs and tracebacks.
        return "NamespaceKeyer(secret=<redacted>)"

    def namespace_id(self, identity: CacheIdentity) -> str:
        """Hex HMAC-SHA-256 over :func:`encode_identity` (64 lowercase hex chars)."""
        return self._mac(encode_identity(identity))

    def verify(self, identity: CacheIdentity, tag: str) -> bool:
        """True iff ``tag`` is :meth:`namespace_id` of ``identity``; constant-time, never raises on bad input."""
        if not isinstance(tag, str):
            return False
        expected = self.namespace_id(identity).encode("ascii")
        return hmac.compare_digest(expected, tag.encode("utf-8", errors="surrogatepass"))

    def _mac(self, message: bytes) -> str:
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()
