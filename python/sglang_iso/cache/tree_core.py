"""Storage and walking mechanics of the tenant-partitioned radix tree (internal).

:class:`TreeCore` owns the roots, the per-namespace accounting and the slot
set, and implements walk / store / split / lock / evict on them. The public
contract (what each operation promises) lives in
:class:`~sglang_iso.cache.tenant_radix_tree.TenantRadixTree`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

from sglang_iso.cache.namespaces import NamespaceState, Registration, SharedPrefix
from sglang_iso.cache.node import RootNode, TreeNode, common_prefix_len, iter_subtree, page_key
from sglang_iso.cache.results import SHARED_NAMESPACE_PREFIX

logger = logging.getLogger(__name__)


class _Walk(NamedTuple):
    node: TreeNode
    """Last node matched (the root when nothing matched)."""
    indices: list[int]


class _Stored(NamedTuple):
    last: TreeNode
    prefix_len: int
    inserted_len: int
    duplicates: list[int]


class TreeCore:
    """Mechanics shared by the public tree; every method here may mutate the tree."""

    def __init__(self, page_size: int, free_fn: Callable[[list[int]], None]) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
        self.page_size = page_size
        """Tokens per KV page; fixed for the tree's life."""
        self._free_fn = free_fn
        """The one exit for slots: eviction, quota, flush and reset call it, nothing else frees."""
        self._private: dict[str, RootNode] = {}
        """namespace -> root of its own prefixes."""
        self._shared_roots: dict[str, RootNode] = {}
        """shared name -> root holding at most the one declared node; created by ``declare_shared``."""
        self._cont: dict[str, dict[str, RootNode]] = {}
        """shared name -> namespace -> root of that namespace's continuations after the shared prefix."""
        self._shared: dict[str, SharedPrefix] = {}
        """shared name -> declaration (immutable once declared)."""
        self._registrations: dict[str, Registration] = {}
        """namespace -> tenant and scope, consulted only to route to shared prefixes."""
        self._ns: dict[str, NamespaceState] = {}
        """namespace -> config and accounting (tokens); created on first use."""
        self._resident: set[int] = set()
        """Every slot currently owned by some node."""
        self._clock = 0
        """Logical LRU clock, +1 per match/insert."""
        self._violations = 0
        """Isolation violations detected, all namespaces."""

    def _check_ns(self, ns: str, *, allow_shared: bool) -> None:
        if not isinstance(ns, str) or not ns:
            raise ValueError(f"namespace must be a non-empty str, got {ns!r}")
        if ns.startswith(SHARED_NAMESPACE_PREFIX):
            if not allow_shared:
                raise ValueError(f"tenant namespaces may not start with {SHARED_NAMESPACE_PREFIX!r}: {ns!r}")
            if ns[len(SHARED_NAMESPACE_PREFIX) :] not in self._shared:
                raise ValueError(f"unknown shared namespace {ns!r}; declared: {sorted(self._shared)}")

    def _state(self, ns: str) -> NamespaceState:
        state = self._ns.get(ns)
        if state is None:
            state = self._ns[ns] = NamespaceState(ns)
        return state

    def _aligned(self, tokens: Sequence[int]) -> tuple[int, ...]:
        return tuple(tokens[: len(tokens) - len(tokens) % self.page_size])

    def _route(self, ns: str, key: tuple[int, ...]) -> SharedPrefix | None:
        """The longest declared shared prefix of ``key`` that ``ns`` may read (depends on config only)."""
        reg = self._registrations.get(ns)
        if reg is None:
            return None
        best: SharedPrefix | None = None
        for decl in self._shared.values():
            n = len(decl.tokens)
            if n > len(key) or key[:n] != decl.tokens or not decl.readable_by(reg):
                continue
            if self._ns[decl.namespace].policy == "off":
                continue
            if best is None or n > len(best.tokens):
                best = decl
        return best

    def _root(self, kind: Literal["private", "cont"], ns: str, shared_name: str | None) -> RootNode:
        if kind == "private":
            root = self._private.get(ns)
            if root is None:
                root = self._private[ns] = RootNode(ns, "private", None)
            return root
        assert shared_name is not None
        by_ns = self._cont.setdefault(shared_name, {})
        root = by_ns.get(ns)
        if root is None:
            root = by_ns[ns] = RootNode(ns, "cont", shared_name)
        return root

    def _owned_roots(self, owner: str) -> list[RootNode]:
        if owner.startswith(SHARED_NAMESPACE_PREFIX):
            root = self._shared_roots.get(owner[len(SHARED_NAMESPACE_PREFIX) :])
            return [] if root is None else [root]
        roots = [by_ns[owner] for by_ns in self._cont.values() if owner in by_ns]
        private = self._private.get(owner)
        return roots if private is None else [private, *roots]

    def _all_roots(self) -> list[RootNode]:
        conts = [root for by_ns in self._cont.values() for root in by_ns.values()]
        return [*self._private.values(), *self._shared_roots.values(), *conts]

    def _violation(self, ns: str, op: str, detail: str) -> None:
        self._violations += 1
        self._state(ns).violations += 1
        logger.warning("isolation-violation op=%s namespace=%s %s", op, ns, detail)

    def _walk(self, root: RootNode, key: Sequence[int], expected_owner: str, ns: str) -> _Walk:
        """Follow ``key`` down from ``root``; stops at the first node not owned by ``expected_owner``."""
        node: TreeNode = root
        indices: list[int] = []
        pos = 0
        if root.owner != expected_owner:
            self._violation(ns, "match", f"expected_owner={expected_owner} root_owner={root.owner}")
            return _Walk(root, indices)
        while pos < len(key):
            child = node.children.get(page_key(key, pos, self.page_size))
            if child is None:
                break
            # SECURITY: fail closed on a foreign node: return only what was matched above it.
            if child.owner != expected_owner:
                self._violation(ns, "match", f"expected_owner={expected_owner} found_owner={child.owner}")
                break
            n = common_prefix_len(child.key, key, pos, self.page_size)
            assert n > 0, f"{n=} {pos=}"
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = self._clock
            indices.extend(child.value)
            node, pos = child, pos + n
        return _Walk(node, indices)

    def _store(self, root: RootNode, key: Sequence[int], values: list[int], expected_owner: str, ns: str) -> _Stored:
        """Insert ``key -> values`` under ``root``; the new leaf is owned by ``expected_owner``."""
        node: TreeNode = root
        duplicates: list[int] = []
        pos = 0
        if root.owner != expected_owner:
            self._violation(ns, "insert", f"expected_owner={expected_owner} root_owner={root.owner}")
            return _Stored(root, 0, 0, duplicates)
        while pos < len(key):
            child = node.children.get(page_key(key, pos, self.page_size))
            if child is None:
                break
            # SECURITY: never extend or split another namespace's node; store nothing further.
            if child.owner != expected_owner:
                self._violation(ns, "insert", f"expected_owner={expected_owner} found_owner={child.owner}")
                return _Stored(node, pos, 0, duplicates)
            n = common_prefix_len(child.key, key, pos, self.page_size)
            assert n > 0, f"{n=} {pos=}"
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = self._clock
            mine = values[pos : pos + n]
            duplicates.extend(m for m, cached in zip(mine, child.value, strict=True) if m != cached)
            node, pos = child, pos + n
        # SECURITY: a slot the tree already owns must not be handed back to the caller as a duplicate,
        # nor stored twice (it would be freed twice and reused under two owners).
        if not self._resident.isdisjoint(duplicates):
            self._violation(ns, "insert", "caller passed slots already owned by the cache")
            duplicates = [i for i in duplicates if i not in self._resident]
        if pos == len(key):
            return _Stored(node, pos, 0, duplicates)
        new = values[pos:]
        if len(set(new)) != len(new) or not self._resident.isdisjoint(new) or not set(new).isdisjoint(duplicates):
            self._violation(ns, "insert", "refused slots already owned by the cache")
            return _Stored(node, pos, 0, duplicates)
        leaf = TreeNode(expected_owner, tuple(key[pos:]), new, node)
        leaf.last_access = self._clock
        node.children[page_key(leaf.key, 0, self.page_size)] = leaf
        self._resident.update(new)
        state = self._state(expected_owner)
        state.evictable += len(new)
        state.inserted_tokens += len(new)
        return _Stored(leaf, pos, len(new), duplicates)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; returns the new upper half. Owner, locks and sizes carry over."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child.key) and n % self.page_size == 0, f"{n=} {len(child.key)=}"
        upper = TreeNode(child.owner, child.key[:n], child.value[:n], parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[page_key(child.key, 0, self.page_size)] = child
        parent.children[page_key(upper.key, 0, self.page_size)] = upper
        return upper

    def _check_attached(self, node: TreeNode) -> None:
        walk: TreeNode | None = node
        while walk is not None and not isinstance(walk, RootNode):
            walk = walk.parent
        live = False
        if isinstance(walk, RootNode):
            if walk.kind == "private":
                live = self._private.get(walk.owner) is walk
            elif walk.kind == "shared":
                live = self._shared_roots.get(walk.shared_name or "") is walk
            else:
                live = self._cont.get(walk.shared_name or "", {}).get(walk.owner) is walk
        if not live:
            raise RuntimeError(f"stale or foreign handle: {node!r} is not in this tree")

    def _lock_path(self, node: TreeNode, delta: Literal[1, -1]) -> None:
        walk: TreeNode | None = node
        while walk is not None and not isinstance(walk, RootNode):
            state = self._ns[walk.owner]
            size = len(walk.value)
            if delta > 0 and walk.lock_ref == 0:
                state.evictable, state.protected = state.evictable - size, state.protected + size
            walk.lock_ref += delta
            if delta < 0 and walk.lock_ref == 0:
                state.evictable, state.protected = state.evictable + size, state.protected - size
            walk = walk.parent

    def _is_evictable(self, node: TreeNode) -> bool:
        parent = node.parent
        if parent is None or isinstance(node, RootNode) or node.lock_ref > 0 or node.children:
            return False
        if isinstance(parent, RootNode) and parent.kind == "shared":
            # A shared node outlives every continuation hanging off it.
            return not any(r.children for r in self._cont.get(parent.shared_name or "", {}).values())
        return True

    def _evict_lru(self, budget: int, roots: list[RootNode] | None) -> int:
        """Evict LRU unlocked leaves under ``roots`` (None: all) until ``budget`` tokens are freed."""
        scope = self._all_roots() if roots is None else roots
        in_scope = {id(r) for r in scope}
        seq = itertools.count()
        heap = [(n.last_access, next(seq), n, r) for r in scope for n in iter_subtree(r) if self._is_evictable(n)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < budget:
            _, _, node, root = heapq.heappop(heap)
            if not self._is_evictable(node):
                continue
            freed += len(node.value)
            for cand, cand_root in self._remove_leaf(node, root):
                if id(cand_root) in in_scope and self._is_evictable(cand):
                    heapq.heappush(heap, (cand.last_access, next(seq), cand, cand_root))
        return freed

    def _remove_leaf(self, node: TreeNode, root: RootNode) -> list[tuple[TreeNode, RootNode]]:
        """Detach an evictable leaf, free its slots; returns nodes that may have become evictable."""
        parent = node.parent
        assert parent is not None and not node.children and node.lock_ref == 0, f"{node=}"
        del parent.children[page_key(node.key, 0, self.page_size)]
        node.parent = None
        state = self._ns[node.owner]
        state.evictable -= len(node.value)
        state.evicted_tokens += len(node.value)
        self._resident.difference_update(node.value)
        self._free_fn(list(node.value))
        if parent is not root:
            return [(parent, root)]
        if root.kind == "cont" and root.shared_name is not None and not parent.children:
            shared_root = self._shared_roots[root.shared_name]
            return [(n, shared_root) for n in shared_root.children.values()]
        return []
