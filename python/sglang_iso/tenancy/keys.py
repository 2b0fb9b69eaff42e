"""API keys: minting, hashing, and resolving a presented key to its principal.

Only SHA-256 digests of keys are stored (in the tenants file); the key itself is
shown once by ``sglang-iso keys new``. A request authenticates with
``Authorization: Bearer <key>``; :func:`parse_bearer` extracts the key and
:meth:`KeyIndex.lookup` maps it to a :class:`Principal`, or ``None``.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Literal

from sglang_iso.names import is_valid_tenant_id
from sglang_iso.tenancy.config import TenantsConfig

API_KEY_PREFIX = "sk-iso-"
"""Prefix of keys minted by :func:`new_api_key` (lets secret scanners recognise leaked keys)."""

API_KEY_RANDOM_BYTES = 32
"""Entropy of a minted key, in bytes (256 bits)."""

MAX_PRESENTED_KEY_CHARS = 1024
"""A presented key longer than this is refused without hashing (no valid key is that long)."""

PrincipalKind = Literal["tenant", "admin", "router"]


@dataclass(frozen=True)
class Principal:
    """Who a key belongs to. Immutable. Build with :meth:`for_tenant` / :meth:`for_admin`."""

    kind: PrincipalKind
    """``"tenant"``: a tenant's API key; ``"admin"``: an operator key (``admin_key_sha256``); ``"router"``: the
    prefill/decode router's key (``router_key_sha256``), which may set the ``bootstrap_*`` fields and names the
    tenant it forwards for in the request id (``server/pd_gate.py``)."""
    tenant_id: str | None
    """The tenant for ``kind == "tenant"``; ``None`` for admins (an admin key is not any tenant's)."""
    adapters: frozenset[str] = frozenset()
    """LoRA adapters the tenant may use (its ``adapters`` list); always empty for admins."""

    def __post_init__(self) -> None:
        if self.kind == "tenant":
            if not is_valid_tenant_id(self.tenant_id):
                raise ValueError(f"tenant_id: a tenant principal needs a valid tenant id, got {self.tenant_id!r}")
        elif self.kind in ("admin", "router"):
            if self.adapters:
                raise ValueError(f"adapters: an {self.kind} principal has no adapter allow-list")
            if self.tenant_id is not None:
                raise ValueError(f"tenant_id: an {self.kind} principal has no tenant id, got {self.tenant_id!r}")
        else:
            raise ValueError(f"kind: must be 'tenant', 'admin' or 'router', got {self.kind!r}")

    @classmethod
    def for_tenant(cls, tenant_id: str, adapters: frozenset[str] = frozenset()) -> Principal:
        return cls("tenant", tenant_id, adapters)

    @classmethod
    def for_admin(cls) -> Principal:
        return cls("admin", None)

    @classmethod
    def for_router(cls) -> Principal:
        return cls("router", None)

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    @property
    def is_router(self) -> bool:
        return self.kind == "router"


def new_api_key() -> str:
    """A fresh random key: ``sk-iso-`` + ``secrets.token_urlsafe(32)`` (43 URL-safe chars)."""
    return API_KEY_PREFIX + secrets.token_urlsafe(API_KEY_RANDOM_BYTES)


def key_sha256(key: str) -> str:
    """Lowercase SHA-256 hex digest of the key's (ASCII) bytes, as stored in ``key_sha256 = [...]``.

    Raises ``ValueError`` (naming ``key``) if the key is empty, has surrounding
    whitespace, or contains characters :func:`parse_bearer` would refuse: such a key
    could never be presented, so its hash would be a silent dead entry.
    """
    if not key:
        raise ValueError("key: must not be empty")
    if not _is_token(key):
        raise ValueError("key: must be printable ASCII without spaces (as sent in an Authorization: Bearer header)")
    return _digest(key)


class KeyIndex:
    """Resolves presented keys to principals for one :class:`TenantsConfig`. Immutable after construction.

    Rebuild it when the config is reloaded; it keeps no reference to the config.
    """

    __slots__ = ("_entries", "_tenants")

    def __init__(self, config: TenantsConfig) -> None:
        """Raises ``ValueError`` if a hash belongs to two principals (``load_tenants_file`` already refuses it)."""
        entries: dict[str, Principal] = {}
        pairs = [(digest, Principal.for_admin()) for digest in sorted(config.admin_key_hashes)]
        pairs += [(digest, Principal.for_router()) for digest in sorted(config.router_key_hashes)]
        for tenant in config.tenants.values():
            pairs.extend(
                (digest, Principal.for_tenant(tenant.id, tenant.adapters)) for digest in sorted(tenant.key_hashes)
            )
        for digest, principal in pairs:
            # NOTE: a real check, not an assert: an ambiguous key would be a privilege confusion.
            if digest in entries:
                raise ValueError(f"key_sha256: hash {digest[:12]}... maps to both {entries[digest]} and {principal}")
            entries[digest] = principal
        self._entries = entries
        self._tenants = {t.id: Principal.for_tenant(t.id, t.adapters) for t in config.tenants.values()}

    def __len__(self) -> int:
        return len(self._entries)

    def tenant(self, tenant_id: str) -> Principal | None:
        """The principal of tenant ``tenant_id`` (for a request the router forwards for it), or ``None``."""
        return self._tenants.get(tenant_id)

    def lookup(self, presented_key: str) -> Principal | None:
        """The principal owning ``presented_key``, or ``None`` if no stored hash matches.

        NOTE: the presented key is hashed first and the stored digests are looked up by the digest, in one dict
        lookup whatever the number of keys (10,000 tenants cost what 2 do). That lookup's timing depends only on
        the SHA-256 digest of what the client sent, which the client cannot steer toward a stored digest
        (finding a key with a chosen digest prefix is a preimage search); and whether a key matched is what the
        401 answer says anyway. No presented key is ever compared to a stored one.
        """
        if not isinstance(presented_key, str) or not presented_key or len(presented_key) > MAX_PRESENTED_KEY_CHARS:
            return None
        if not _is_token(presented_key):
            return None
        return self._entries.get(_digest(presented_key))


def parse_bearer(header: str | None) -> str | None:
    """The key in an ``Authorization`` header value ``Bearer <key>``, or ``None``.

    The scheme is case-insensitive; surrounding whitespace is stripped. Returns
    ``None`` for a missing header, another scheme, an empty key, or a key with
    inner whitespace or characters outside printable ASCII.
    """
    if header is None:
        return None
    parts = header.strip().split(None, 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    token = parts[1].strip()
    if not token or not _is_token(token):
        return None
    return token


def _is_token(value: str) -> bool:
    """Every char is printable ASCII other than space (0x21-0x7e); true for "" (callers check emptiness)."""
    # NOTE: in C: printable ASCII is 0x20-0x7e, less the space; this runs twice on every request.
    return value.isascii() and value.isprintable() and " " not in value


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()
