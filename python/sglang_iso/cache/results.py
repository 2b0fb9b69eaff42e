"""Small immutable results of :class:`~sglang_iso.cache.tenant_radix_tree.TenantRadixTree`."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from sglang_iso.constants import CachePolicy

if TYPE_CHECKING:
    from sglang_iso.cache.node import TreeNode


@dataclass(frozen=True, eq=False)
class NodeHandle:
    """Opaque lock handle returned by ``match``: the last node of each matched segment.

    A shared-prefix match has two segments (the shared node, then the
    requester's continuation), so one ``inc_lock``/``dec_lock`` covers both.
    Empty when nothing matched; locking an empty handle is a no-op.
    """

    nodes: tuple[TreeNode, ...]
    """Segment end nodes, in key order. Internal: do not inspect or mutate."""

    @property
    def is_empty(self) -> bool:
        return not self.nodes


class MatchResult(NamedTuple):
    """Result of ``match``. The indices are only safe to use while ``last_node`` is locked."""

    slots: array
    """KV slots of the matched prefix, one per token, ``array('q')`` (the caller's to keep)."""
    last_node: NodeHandle
    """Handle to lock (``inc_lock``) before using ``indices`` beyond the current call."""
    prefix_len: int
    """Matched tokens; equals ``len(slots)`` and is a multiple of the page size."""

    @property
    def indices(self) -> tuple[int, ...]:
        """``slots`` as a tuple of ints (a copy: for callers that compare or hash them)."""
        return tuple(self.slots)


class InsertResult(NamedTuple):
    """Result of ``insert``; says who owns each of the caller's indices afterwards.

    ::

        tokens:  [0 ........ prefix_len) [prefix_len ... stored_len) [stored_len ... len)
        owner:    tree (already cached)   tree (taken from caller)    caller (not stored)

    In the first range the tree keeps its own slots; the caller's slots there
    that differ from the tree's are ``duplicate_indices``, which the caller must
    free (the tree never will). The last range (policy off, an unaligned page
    tail, or a refused insert) stays entirely with the caller.
    """

    prefix_len: int
    """Tokens that were already cached in the requester's view."""
    inserted_len: int
    """Tokens newly stored; the tree now owns the caller's slots for them."""
    duplicate_indices: tuple[int, ...]
    """Caller's slots in ``[0, prefix_len)`` that differ from the cached ones; caller frees them."""

    @property
    def stored_len(self) -> int:
        """Tokens the tree holds for this sequence after the insert."""
        return self.prefix_len + self.inserted_len


class NamespaceStats(NamedTuple):
    """Accounting snapshot of one namespace (all sizes in tokens)."""

    namespace: str
    resident: int
    """Tokens stored in nodes this namespace owns (= evictable + protected)."""
    evictable: int
    """Resident tokens in unlocked nodes."""
    protected: int
    """Resident tokens in locked nodes."""
    quota: int | None
    """Soft cap on ``resident``; None means unlimited."""
    policy: CachePolicy
    hit_tokens: int
    """Tokens returned by ``match`` (for a shared namespace: tokens served to readers)."""
    lookup_tokens: int
    """Page-aligned tokens asked for by ``match``."""
    inserted_tokens: int
    """Tokens newly stored by ``insert``."""
    evicted_tokens: int
    """Tokens released through ``free_fn`` (eviction, quota, flush, reset)."""
    violations: int
    """Isolation violations detected on requests of this namespace."""
