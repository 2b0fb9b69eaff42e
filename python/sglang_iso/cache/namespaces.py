"""Per-namespace configuration and accounting records of the tenant-partitioned tree (internal)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from sglang_iso.cache.results import NamespaceStats
from sglang_iso.constants import SHARED_NAMESPACE_PREFIX, CachePolicy

if TYPE_CHECKING:
    from sglang_iso.cache.node import TreeNode


@dataclass
class NamespaceState:
    """Mutable config and counters of one namespace. Mutated only by ``TenantRadixTree``."""

    namespace: str
    evictable: int = 0
    """Tokens in this namespace's unlocked nodes."""
    protected: int = 0
    """Tokens in this namespace's locked nodes."""
    quota: int | None = None
    """Soft cap on resident tokens; None: unlimited."""
    policy: CachePolicy = "private"
    hit_tokens: int = 0
    lookup_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens: int = 0
    violations: int = 0
    leaves: dict[TreeNode, None] = field(default_factory=dict, repr=False, compare=False)
    """Evictable leaves owned by this namespace (unlocked, childless; a shared node also needs every
    continuation of its prefix gone), as an insertion-ordered set. Kept current by ``TreeCore`` on every
    store, split, lock, unlock and removal, so eviction never walks the whole tree."""

    @property
    def resident(self) -> int:
        return self.evictable + self.protected

    def snapshot(self) -> NamespaceStats:
        return NamespaceStats(
            namespace=self.namespace,
            resident=self.resident,
            evictable=self.evictable,
            protected=self.protected,
            quota=self.quota,
            policy=self.policy,
            hit_tokens=self.hit_tokens,
            lookup_tokens=self.lookup_tokens,
            inserted_tokens=self.inserted_tokens,
            evicted_tokens=self.evicted_tokens,
            violations=self.violations,
        )


@dataclass(frozen=True)
class Registration:
    """What the tree knows about a tenant namespace, for shared-prefix read checks."""

    tenant_id: str
    scope: str
    """KV-compatibility scope: requests in one scope compute identical KV for identical tokens (the tenant cache
    uses the base model's scope, and one per adapter load); a shared prefix is read only within its scope."""


@dataclass(frozen=True)
class SharedPrefix:
    """An operator-declared prefix whose KV may be read by several tenants."""

    name: str
    tokens: tuple[int, ...]
    """The only token sequence ever stored under this name (whole pages)."""
    readers: frozenset[str] | Literal["*"]
    """Tenant ids allowed to read, or ``"*"`` for every registered tenant in ``scope``."""
    scope: str
    """Only namespaces registered with this scope id may read: the KV must be bit-compatible."""
    key: array = field(compare=False, repr=False)
    """``tokens`` as ``array('q')``, the form tree keys take (compared against request keys)."""

    @property
    def namespace(self) -> str:
        return SHARED_NAMESPACE_PREFIX + self.name

    def readable_by(self, registration: Registration) -> bool:
        if registration.scope != self.scope:
            return False
        return self.readers == "*" or registration.tenant_id in self.readers
