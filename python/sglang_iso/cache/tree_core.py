"""Storage and walking mechanics of the tenant-partitioned radix tree (internal).

:class:`TreeCore` owns the roots, the per-namespace accounting, the slot set
and the evictable-leaf sets, and implements walk / store / split / lock /
evict on them. The public contract (what each operation promises) lives in
:class:`~sglang_iso.cache.tenant_radix_tree.TenantRadixTree`.

Performance notes (the tree runs on the scheduler thread for every request):
keys are ``array('q')`` and values tuples, so matching, splitting and
duplicate detection are C-level slice operations; evictable leaves are kept
per namespace incrementally (as upstream's ``evictable_leaves``), so eviction
heaps only over leaves; the resident slots the isolation checks need are a
bitmap claimed and released a node's slot array at a time (``resident``), so
no operation does per-slot Python work beyond converting a fresh insert's slots.
"""

from __future__ import annotations

import heapq
import logging
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, NamedTuple

import numpy as np

from sglang_iso.cache.namespaces import NamespaceState, Registration, SharedPrefix
from sglang_iso.cache.node import RootNode, TreeNode, common_prefix_len, iter_subtree, page_key
from sglang_iso.cache.resident import MAX_SLOT, ResidentSlots
from sglang_iso.constants import SHARED_NAMESPACE_PREFIX

logger = logging.getLogger(__name__)

EvictScope = str | list[RootNode] | None
"""What ``_evict_lru`` may evict: None: everything; a namespace: the nodes it owns; roots: nodes under them."""


class _Walk(NamedTuple):
    node: TreeNode
    """Last node matched (the root when nothing matched)."""
    indices: array


class _Stored(NamedTuple):
    last: TreeNode
    prefix_len: int
    inserted_len: int
    duplicates: list[int]


def as_key(tokens: Sequence[int], length: int) -> array:
    """``tokens[:length]`` as ``array('q')`` (the caller's array itself when it already is one, uncut).

    Raises:
        ValueError: a token is not an int in the int64 range.
    """
    if type(tokens) is array and tokens.typecode == "q":
        return tokens if length == len(tokens) else tokens[:length]
    try:
        return array("q", tokens[:length])
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"tokens must be ints in the int64 range: {exc}") from None


def as_slots(slots: Sequence[int], length: int) -> array:
    """``slots[:length]`` as ``array('q')`` (bools, numpy ints and 0-d tensors converted through ``__index__``).

    NOTE: the conversion is also the type check: anything that is not an integer slot id is refused here, before
    the tree changes, so no slot of another type or range can reach the resident-slot check.

    Raises:
        ValueError: a slot is not an integer in ``0 .. MAX_SLOT``.
    """
    if type(slots) is array and slots.typecode == "q":
        out = slots[:length]  # a copy: the caller may reuse its array
    else:
        try:
            out = array("q", slots[:length])
        except (TypeError, OverflowError) as exc:
            raise ValueError(f"indices must be integers in 0..{MAX_SLOT}: {exc}") from None
    if out:
        view = slot_view(out)
        lo, hi = int(view.min()), int(view.max())
        if lo < 0 or hi > MAX_SLOT:
            raise ValueError(f"indices must be integers in 0..{MAX_SLOT}, got {lo if lo < 0 else hi}")
    return out


def slot_view(slots: array) -> np.ndarray:
    """A numpy view (no copy) of ``slots``; the array must not be resized while the view lives."""
    return np.frombuffer(slots, dtype=np.int64) if slots else _NO_SLOTS


_NO_SLOTS = np.zeros(0, dtype=np.int64)


class TreeCore:
    """Mechanics shared by the public tree; every method here may mutate the tree."""

    def __init__(self, page_size: int, free_fn: Callable[[array], None]) -> None:
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
        self._quota_ns: set[str] = set()
        """Namespaces with a quota set (the only ones ``evict`` checks for excess first)."""
        self._resident = ResidentSlots()
        """Every slot currently owned by some node."""
        # NOTE: SGLang asks for the evictable and protected sizes several times per scheduler iteration; the sums
        # over namespaces are kept here, beside every change of a namespace's counters, so the answer is O(1).
        self._evictable_total = 0
        self._protected_total = 0
        self._leaves: dict[TreeNode, None] = {}
        """Every namespace's evictable leaves (the union of ``NamespaceState.leaves``, same rule), as an
        insertion-ordered set: a global eviction heaps over it without visiting each namespace."""
        self._clock = 0
        """Logical LRU clock, +1 per match/insert."""
        self._violations = 0
        """Isolation violations detected, all namespaces."""
        self._spill_fn: Callable[[str, array, tuple[int, ...]], None] | None = None
        """Called with (owner, token path from the first token, slots of the path's tail) for each leaf evicted
        under device pressure, before its slots are freed (the host tier copies them out); see ``set_spill``."""
        self._spilling = False
        """True only inside ``evict``: flush, quota and reset never spill."""

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

    def _aligned(self, tokens: Sequence[int]) -> array:
        """The whole pages of ``tokens`` as an ``array('q')`` key (no copy when already aligned ``array('q')``)."""
        return as_key(tokens, len(tokens) - len(tokens) % self.page_size)

    def _route(self, ns: str, key: array) -> SharedPrefix | None:
        """The longest declared shared prefix of ``key`` that ``ns`` may read (depends on config only)."""
        reg = self._registrations.get(ns)
        if reg is None:
            return None
        best: SharedPrefix | None = None
        for decl in self._shared.values():
            n = len(decl.key)
            if n > len(key) or key[:n] != decl.key or not decl.readable_by(reg):
                continue
            if self._ns[decl.namespace].policy == "off":
                continue
            if best is None or n > len(best.key):
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

    def _walk(self, root: RootNode, key: array, expected_owner: str, ns: str) -> _Walk:
        """Follow ``key`` down from ``root``; stops at the first node not owned by ``expected_owner``."""
        node: TreeNode = root
        indices = array("q")
        if root.owner != expected_owner:
            self._violation(ns, "match", f"expected_owner={expected_owner} root_owner={root.owner}")
            return _Walk(root, indices)
        page, clock, end, pos = self.page_size, self._clock, len(key), 0
        while pos < end:
            child = node.children.get(key[pos] if page == 1 else tuple(key[pos : pos + page]))
            if child is None:
                break
            # SECURITY: fail closed on a foreign node: return only what was matched above it.
            if child.owner != expected_owner:
                self._violation(ns, "match", f"expected_owner={expected_owner} found_owner={child.owner}")
                break
            n = common_prefix_len(child.key, key, pos, page)
            assert n > 0, f"{n=} {pos=}"
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = clock
            indices += child.value
            node, pos = child, pos + n
        return _Walk(node, indices)

    def _store(self, root: RootNode, key: array, values: array, expected_owner: str, ns: str) -> _Stored:
        """Insert ``key -> values`` under ``root``; the new leaf is owned by ``expected_owner``.

        ``values`` are the caller's slots (:func:`as_slots`): only the new range is stored; the cached range is
        only compared.
        """
        node: TreeNode = root
        duplicates: list[int] = []
        if root.owner != expected_owner:
            self._violation(ns, "insert", f"expected_owner={expected_owner} root_owner={root.owner}")
            return _Stored(root, 0, 0, duplicates)
        page, clock, end, pos = self.page_size, self._clock, len(key), 0
        while pos < end:
            child = node.children.get(key[pos] if page == 1 else tuple(key[pos : pos + page]))
            if child is None:
                break
            # SECURITY: never extend or split another namespace's node; store nothing further.
            if child.owner != expected_owner:
                self._violation(ns, "insert", f"expected_owner={expected_owner} found_owner={child.owner}")
                return _Stored(node, pos, 0, duplicates)
            n = common_prefix_len(child.key, key, pos, page)
            assert n > 0, f"{n=} {pos=}"
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = clock
            mine = values[pos : pos + n]
            if mine != child.value:
                duplicates += [m for m, cached in zip(mine, child.value, strict=True) if m != cached]
            node, pos = child, pos + n
        resident = self._resident
        # SECURITY: a slot the tree already owns must not be handed back to the caller as a duplicate,
        # nor stored twice (it would be freed twice and reused under two owners).
        if duplicates and resident.any_of(duplicates):
            self._violation(ns, "insert", "caller passed slots already owned by the cache")
            duplicates = [i for i in duplicates if i not in resident]
        if pos == end:
            return _Stored(node, pos, 0, duplicates)
        new = values[pos:]
        if duplicates and not set(duplicates).isdisjoint(new):
            self._violation(ns, "insert", "refused slots already owned by the cache")
            return _Stored(node, pos, 0, duplicates)
        # NOTE: the claim checks and holds in one call: nothing is held when one slot is resident or repeats.
        if not resident.claim(slot_view(new)):
            self._violation(ns, "insert", "refused slots already owned by the cache")
            return _Stored(node, pos, 0, duplicates)
        leaf = TreeNode(expected_owner, key[pos:], new, node)
        leaf.last_access = clock
        node.children[page_key(leaf.key, 0, page)] = leaf
        state = self._state(expected_owner)
        state.evictable += len(new)
        self._evictable_total += len(new)
        state.inserted_tokens += len(new)
        if isinstance(node, RootNode):
            if node.kind == "cont":
                self._refresh_shared_leaves(node)
            self._refresh_leaf(leaf)
        else:
            # Same root, hence same owner: the parent stops being a leaf, the new node is one.
            state.leaves.pop(node, None)
            self._leaves.pop(node, None)
            state.leaves[leaf] = None
            self._leaves[leaf] = None
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
        # The upper half has a child, so it is no leaf; ``child`` keeps its status unless it just left a shared
        # root (where leaves follow a stricter rule).
        if isinstance(parent, RootNode) and parent.kind == "shared":
            self._refresh_leaf(child)
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
                self._evictable_total -= size
                self._protected_total += size
                state.leaves.pop(walk, None)
                self._leaves.pop(walk, None)
            walk.lock_ref += delta
            if delta < 0 and walk.lock_ref == 0:
                state.evictable, state.protected = state.evictable + size, state.protected - size
                self._evictable_total += size
                self._protected_total -= size
                if not walk.children:
                    self._refresh_leaf(walk)
            walk = walk.parent

    def _is_evictable(self, node: TreeNode) -> bool:
        parent = node.parent
        if parent is None or isinstance(node, RootNode) or node.lock_ref > 0 or node.children:
            return False
        if isinstance(parent, RootNode) and parent.kind == "shared":
            # A shared node outlives every continuation hanging off it.
            return not any(r.children for r in self._cont.get(parent.shared_name or "", {}).values())
        return True

    def _refresh_leaf(self, node: TreeNode) -> None:
        """Put ``node`` in or out of its owner's evictable-leaf set, per ``_is_evictable``."""
        leaves = self._ns[node.owner].leaves
        if self._is_evictable(node):
            leaves[node] = None
            self._leaves[node] = None
        else:
            leaves.pop(node, None)
            self._leaves.pop(node, None)

    def _refresh_shared_leaves(self, cont_root: RootNode) -> list[TreeNode]:
        """Re-rate the shared node above ``cont_root`` (its continuations changed); returns it if evictable."""
        shared_root = self._shared_roots[cont_root.shared_name or ""]
        out = []
        for shared_node in shared_root.children.values():
            self._refresh_leaf(shared_node)
            if shared_node in self._leaves:
                out.append(shared_node)
        return out

    def _evict_lru(self, budget: int, scope: EvictScope) -> int:
        """Evict LRU unlocked leaves in ``scope`` (see ``EvictScope``) until ``budget`` tokens are freed."""
        if budget <= 0:
            return 0
        cands: Iterable[TreeNode]
        if scope is None:
            cands = self._leaves
        elif isinstance(scope, str):
            state = self._ns.get(scope)
            cands = () if state is None else state.leaves
        else:
            cands = [n for r in scope for n in iter_subtree(r) if n in self._leaves]
        # NOTE: the index breaks last_access ties deterministically (leaf sets are insertion-ordered). The heap is
        # built before anything is removed, so iterating the live leaf dicts here is safe.
        heap = [(n.last_access, i, n) for i, n in enumerate(cands)]
        heapq.heapify(heap)
        seq = len(heap)
        freed = 0
        released: list[np.ndarray] = []
        slots = array("q")
        try:
            while heap and freed < budget:
                node = heapq.heappop(heap)[2]
                if not self._is_evictable(node):
                    continue
                became_leaves = self._remove_leaf(node)
                # NOTE: only a detached leaf's slots are freed: a failure before that leaves them with the tree.
                freed += len(node.value)
                released.append(slot_view(node.value))
                slots.extend(node.value)
                for cand in became_leaves:
                    if self._in_scope(cand, scope):
                        heapq.heappush(heap, (cand.last_access, seq, cand))
                        seq += 1
        finally:
            # NOTE: one scatter and one release for the whole eviction (each release runs the allocator's defense
            # layers); nothing inserts or allocates between a leaf's removal and this.
            self._resident.release_all(released)
            if slots:
                self._free_fn(slots)
        return freed

    def _in_scope(self, node: TreeNode, scope: EvictScope) -> bool:
        """Whether a node that just became evictable may be taken by the running ``_evict_lru``."""
        if scope is None:
            return True
        if isinstance(scope, str):
            return node.owner == scope
        walk: TreeNode | None = node
        while walk is not None and not isinstance(walk, RootNode):
            walk = walk.parent
        return any(walk is r for r in scope)

    def _remove_leaf(self, node: TreeNode) -> list[TreeNode]:
        """Detach an evictable leaf; returns nodes that became evictable leaves by it.

        The caller frees ``node.value`` and releases it from the resident slots (``_evict_lru`` does both once per
        call, for every leaf it removed).
        """
        parent = node.parent
        assert parent is not None and not node.children and node.lock_ref == 0, f"{node=}"
        page = self.page_size
        key = node.key
        del parent.children[key[0] if page == 1 else tuple(key[:page])]
        node.parent = None
        size = len(node.value)
        state = self._ns[node.owner]
        state.leaves.pop(node, None)
        self._leaves.pop(node, None)
        state.evictable -= size
        state.evicted_tokens += size
        self._evictable_total -= size
        if self._spilling and self._spill_fn is not None:
            self._spill(node, parent)
        if type(parent) is not RootNode:
            if parent.children or parent.lock_ref:
                return []
            # Same root, hence same owner and the same evictability rule: the parent is now an evictable leaf
            # unless it hangs off a shared root (its rule depends on the continuations).
            grand = parent.parent
            if type(grand) is RootNode and grand.kind == "shared":
                self._refresh_leaf(parent)
                return [parent] if parent in self._leaves else []
            state.leaves[parent] = None
            self._leaves[parent] = None
            return [parent]
        if parent.kind == "cont" and not parent.children:
            return self._refresh_shared_leaves(parent)
        return []

    def _spill(self, node: TreeNode, parent: TreeNode) -> None:
        """Hand an evicted leaf's owner, full token path and slots to ``_spill_fn``.

        The path starts at the first token a request sends: a continuation's path begins with its shared
        prefix (its KV was computed after it); a shared node's owner is ``shared:<name>``.
        """
        parts = [node.key]
        walk: TreeNode | None = parent
        while walk is not None and not isinstance(walk, RootNode):
            parts.append(walk.key)
            walk = walk.parent
        if not isinstance(walk, RootNode):
            return
        path = array("q")
        if walk.kind == "cont" and walk.shared_name is not None:
            path.extend(self._shared[walk.shared_name].key)
        for part in reversed(parts):
            path.extend(part)
        assert self._spill_fn is not None
        try:
            self._spill_fn(node.owner, path, tuple(node.value))
        except Exception:  # NOTE: a failed write-back loses a cache entry, never the eviction itself
            logger.exception("sglang-iso: host write-back failed; the evicted entry is dropped")
