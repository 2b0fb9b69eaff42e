"""Keyed namespace ids: HMAC-SHA-256 of an encoded :class:`CacheIdentity`.

The prefix cache partitions entries by these ids. They are keyed with an
operator secret so that a client who knows another tenant's identity fields
still cannot compute (or guess) that tenant's namespace id, and so ids leak
nothing when logged. Three ids exist, each under its own domain tag so none can
equal another:

* :meth:`NamespaceKeyer.namespace_id`: every field, the cache partition key.
* :meth:`NamespaceKeyer.tenant_namespace_id`: every field but ``cache_salt``:
  one id per tenant and model setup, for per-tenant quotas and flushes.
* :meth:`NamespaceKeyer.scope_id`: neither tenant nor salt: which requests
  could compute bit-identical KV, the scope an operator-shared prefix is valid in.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import NamedTuple

from sglang_iso.constants import MIN_SECRET_BYTES
from sglang_iso.identity.cache_identity import CacheIdentity, encode_fields, encode_identity, kv_fields

TENANT_NAMESPACE_DOMAIN_TAG = b"sglang-iso/tenant-namespace"
SCOPE_DOMAIN_TAG = b"sglang-iso/kv-scope"


class NamespaceRef(NamedTuple):
    """The ids a cache needs about one request identity."""

    namespace_id: str
    """Partition key of the request's cache entries (hex)."""
    tenant_id: str
    """Plain tenant id, for reader lists of operator-shared prefixes."""
    scope_id: str
    """KV-compatibility scope (hex); see :meth:`NamespaceKeyer.scope_id`."""


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

    def tenant_namespace_id(self, identity: CacheIdentity) -> str:
        """Like :meth:`namespace_id` but ignoring ``cache_salt``: one id for all of a tenant's salts."""
        fields: list[str | int | None] = [identity.tenant_id, *kv_fields(identity)]
        return self._mac(encode_fields(TENANT_NAMESPACE_DOMAIN_TAG, fields, {3, 4}))

    def scope_id(self, identity: CacheIdentity) -> str:
        """Id of the fields that determine the KV bytes (model, tokenizer, adapter, dtype, page size).

        Two identities with the same scope id compute identical KV for identical
        tokens; an operator-shared prefix is only readable within one scope.
        """
        return self._mac(encode_fields(SCOPE_DOMAIN_TAG, kv_fields(identity), {2, 3}))

    def describe(self, identity: CacheIdentity) -> NamespaceRef:
        """All ids of ``identity`` at once, as the cache's ``register_namespace`` wants them."""
        return NamespaceRef(self.namespace_id(identity), identity.tenant_id, self.scope_id(identity))

    def verify(self, identity: CacheIdentity, tag: str) -> bool:
        """True iff ``tag`` is :meth:`namespace_id` of ``identity``; constant-time, never raises on bad input."""
        if not isinstance(tag, str):
            return False
        expected = self.namespace_id(identity).encode("ascii")
        return hmac.compare_digest(expected, tag.encode("utf-8", errors="surrogatepass"))

    def _mac(self, message: bytes) -> str:
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()
