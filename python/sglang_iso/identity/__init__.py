"""Cache identity: which requests may share KV, and the keyed namespace ids derived from it."""

from __future__ import annotations

from sglang_iso.identity.cache_identity import (
    ENCODING_VERSION,
    IDENTITY_DOMAIN_TAG,
    CacheIdentity,
    encode_identity,
)
from sglang_iso.identity.namespace import NamespaceKeyer

__all__ = [
    "ENCODING_VERSION",
    "IDENTITY_DOMAIN_TAG",
    "CacheIdentity",
    "NamespaceKeyer",
    "encode_identity",
]
