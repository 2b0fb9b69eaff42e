"""A radix prefix cache partitioned by namespace, so one tenant can never read another's KV.

Layout (all sizes in tokens; values are KV pool slot indices)::

    private[ns]           owner ns          ns's own prefixes
    shared[name]          owner shared:name at most one node: exactly the declared tokens
    cont[name][ns]        owner ns          ns's continuations after shared prefix `name`

A request from ``ns`` walks only roots it may use: ``private[ns]``, or, when
its tokens start with a shared prefix readable by ``ns``'s tenant,
``shared[name]`` then ``cont[name][ns]``. Every node carries the owner of its
root, checked on every walk (a mismatch fails closed: the walk stops, the
violation is counted and logged as ``isolation-violation``).

Slots enter the tree only through :meth:`TenantRadixTree.insert` and leave it
only through ``free_fn`` (eviction, quota, flush, reset).

Client eviction priorities are deliberately not accepted: honouring them across
namespaces would let one tenant keep its entries at others' expense, and inside
one namespace LRU is what the quota already needs.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Literal

from sglang_iso.cache.integrity import check_tree_integrity
from sglang_iso.cache.namespaces import NamespaceState, Registration, SharedPrefix
from sglang_iso.cache.node import RootNode, TreeNode, iter_subtree
from sglang_iso.cache.results import InsertResult, MatchResult, NamespaceStats, NodeHandle
from sglang_iso.cache.tree_core import TreeCore, as_key, as_slots
from sglang_iso.constants import CACHE_POLICIES, SHARED_NAMESPACE_PREFIX, CachePolicy
from sglang_iso.names import SHARED_PREFIX_NAME_PATTERN, is_shared_prefix_key

_EMPTY_HANDLE = NodeHandle(())


class TenantRadixTree(TreeCore):
    """Tenant-partitioned radix tree of KV slot indices. Not thread-safe; call from the scheduler thread."""

    def __init__(self, page_size: int, free_fn: Callable[[array], None]) -> None:
        """Args:
            page_size: tokens per KV page; only whole pages are matched, stored and split.
            free_fn: receives every slot array (``array('q')``, the tree's no longer) leaving the tree; the only
                way slots are ever released.

        Raises:
            ValueError: ``page_size`` is not an int >= 1.
        """
        super().__init__(page_size, free_fn)

    # ----------------------------------------------------------------------------------------------- configuration

    def register_namespace(self, ns: str, *, tenant_id: str, scope: str) -> None:
        """Record ``ns``'s tenant and KV scope; needed (only) to read shared prefixes.

        Raises:
            ValueError: bad ``ns``, or ``ns`` already registered with other values.
        """
        self._check_ns(ns, allow_shared=False)
        reg = Registration(tenant_id, scope)
        old = self._registrations.get(ns)
        if old is not None and old != reg:
            raise ValueError(f"namespace {ns!r} is already registered as {old}")
        self._registrations[ns] = reg

    def declare_shared(
        self, name: str, tokens: Sequence[int], readers: frozenset[str] | Literal["*"], *, scope: str
    ) -> str:
        """Declare an operator-shared prefix; returns its namespace id ``shared:<name>``.

        Its KV is supplied by the first reader that inserts a sequence starting
        with ``tokens``; later readers in ``scope`` (``"*"``: every tenant) hit it.

        Raises:
            ValueError: bad or duplicate name, empty, page-unaligned or non-int tokens, bad readers.
        """
        if not is_shared_prefix_key(name):
            raise ValueError(
                f"shared name must match {SHARED_PREFIX_NAME_PATTERN.pattern!r} in lowercase (its key), got {name!r}"
            )
        if name in self._shared:
            raise ValueError(f"shared prefix {name!r} is already declared")
        key = array("q", as_key(tokens, len(tokens)))  # a copy: the caller may reuse its array
        if not key or len(key) % self.page_size:
            raise ValueError(f"shared tokens must be a non-zero multiple of {self.page_size=}, got {len(key)}")
        if readers != "*" and not (isinstance(readers, frozenset) and all(isinstance(r, str) for r in readers)):
            raise ValueError(f"readers must be a frozenset of tenant ids or '*', got {readers!r}")
        decl = SharedPrefix(name, tuple(key), readers, scope, key)
        self._shared[name] = decl
        self._shared_roots[name] = RootNode(decl.namespace, "shared", name)
        self._state(decl.namespace)
        return decl.namespace

    def set_quota(self, ns: str, tokens: int | None) -> None:
        """Set ``ns``'s soft cap on resident tokens (None: unlimited).

        Enforced on ``ns``'s own inserts and first under ``evict`` pressure; evicts nothing by itself.
        """
        self._check_ns(ns, allow_shared=True)
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
            raise ValueError(f"quota must be None or an int >= 0, got {tokens!r}")
        self._state(ns).quota = tokens
        if tokens is None:
            self._quota_ns.discard(ns)
        else:
            self._quota_ns.add(ns)

    def set_policy(self, ns: str, policy: CachePolicy) -> None:
        """``"off"``: ``ns`` stops inserting and matching (existing entries stay until evicted or flushed)."""
        self._check_ns(ns, allow_shared=True)
        if policy not in CACHE_POLICIES:
            raise ValueError(f"policy must be one of {CACHE_POLICIES}, got {policy!r}")
        self._state(ns).policy = policy

    # ------------------------------------------------------------------------------------------------- cache ops

    def match(self, ns: str, tokens: Sequence[int], *, count: bool = True) -> MatchResult:
        """Longest cached page-aligned prefix of ``tokens`` visible to ``ns``.

        ``count=False``: the caller re-reads what it just stored (a checkpoint) or refreshes recency, which is not
        a lookup: the lookup and hit counters of :meth:`stats` stay as they are.

        Mutates: LRU clocks on the path, may split a node at the match end, hit counters (with ``count``).
        The indices are only safe to use beyond this call once ``last_node`` is locked.

        Raises:
            ValueError: bad ``ns``, or a token that is not an int in the int64 range.
        """
        self._check_ns(ns, allow_shared=False)
        state = self._state(ns)
        if state.policy == "off":
            return MatchResult(array("q"), _EMPTY_HANDLE, 0)
        key = self._aligned(tokens)
        self._clock += 1
        if count:
            state.lookup_tokens += len(key)
        shared = self._route(ns, key)
        if shared is None:
            root = self._private.get(ns)
            if root is None:
                return MatchResult(array("q"), _EMPTY_HANDLE, 0)
            walk = self._walk(root, key, ns, ns)
            if walk.node is root:
                return MatchResult(array("q"), _EMPTY_HANDLE, 0)
            if count:
                state.hit_tokens += len(walk.indices)
            return MatchResult(walk.indices, NodeHandle((walk.node,)), len(walk.indices))
        n_shared = len(shared.tokens)
        head = self._walk(self._shared_roots[shared.name], key[:n_shared], shared.namespace, ns)
        if len(head.indices) != n_shared:
            return MatchResult(array("q"), _EMPTY_HANDLE, 0)
        indices, ends = head.indices, [head.node]
        if count:
            self._ns[shared.namespace].hit_tokens += n_shared
        cont = self._cont.get(shared.name, {}).get(ns)
        if cont is not None:
            tail = self._walk(cont, key[n_shared:], ns, ns)
            indices = indices + tail.indices
            ends.append(tail.node)
        if count:
            state.hit_tokens += len(indices)
        handle = NodeHandle(tuple(n for n in ends if not isinstance(n, RootNode)))
        return MatchResult(indices, handle, len(indices))

    def insert(self, ns: str, tokens: Sequence[int], indices: Sequence[int]) -> InsertResult:
        """Cache ``indices`` (one slot per token) under ``ns``; see :class:`InsertResult` for slot ownership.

        Only whole pages are stored. With policy ``"off"`` nothing is stored and
        every slot stays the caller's. If ``ns`` ends above its quota, its own
        LRU unlocked leaves are evicted (never the path just inserted).

        Mutates: the tree, LRU clocks, accounting; may call ``free_fn`` (quota).

        Raises:
            ValueError: bad ``ns``, ``len(indices) != len(tokens)``, a token that is not an int in the int64
                range, or an index that is not an integer slot id (``0 .. MAX_SLOT``); nothing is changed then.
        """
        self._check_ns(ns, allow_shared=False)
        if len(indices) != len(tokens):
            raise ValueError(f"need one index per token: {len(tokens)=} {len(indices)=}")
        if self._state(ns).policy == "off":
            return InsertResult(0, 0, ())
        key = self._aligned(tokens)
        values = as_slots(indices, len(key))
        self._clock += 1
        shared = self._route(ns, key)
        if shared is None:
            res = self._store(self._root("private", ns, None), key, values, ns, ns)
            result = InsertResult(res.prefix_len, res.inserted_len, tuple(res.duplicates))
            ends = [res.last]
        else:
            n_shared = len(shared.tokens)
            head = self._store(self._shared_roots[shared.name], key[:n_shared], values[:n_shared], shared.namespace, ns)
            ends = [head.last]
            if head.prefix_len + head.inserted_len < n_shared or len(key) == n_shared:
                result = InsertResult(head.prefix_len, head.inserted_len, tuple(head.duplicates))
            else:
                cont = self._root("cont", ns, shared.name)
                tail = self._store(cont, key[n_shared:], values[n_shared:], ns, ns)
                ends.append(tail.last)
                dups = tuple(head.duplicates + tail.duplicates)
                if head.inserted_len:
                    # NOTE: continuations exist only under a filled shared node, so a fresh fill has none.
                    assert tail.prefix_len == 0, f"{tail.prefix_len=}"
                    result = InsertResult(0, n_shared + tail.inserted_len, dups)
                else:
                    result = InsertResult(n_shared + tail.prefix_len, tail.inserted_len, dups)
        self._enforce_quota(ns, ends)
        return result

    def inc_lock(self, handle: NodeHandle) -> None:
        """Protect every node from each segment end up to its root from eviction.

        Raises:
            RuntimeError: the handle's nodes are no longer in this tree.
        """
        for node in handle.nodes:
            self._check_attached(node)
        for node in handle.nodes:
            self._lock_path(node, +1)

    def dec_lock(self, handle: NodeHandle) -> None:
        """Undo one :meth:`inc_lock` of ``handle``.

        Raises:
            RuntimeError: stale handle, or a lock count would go below zero (nothing is changed then).
        """
        for node in handle.nodes:
            self._check_attached(node)
            walk: TreeNode | None = node
            while walk is not None and not isinstance(walk, RootNode):
                if walk.lock_ref < 1:
                    raise RuntimeError(f"dec_lock below zero: {walk!r} {walk.lock_ref=}")
                walk = walk.parent
        for node in handle.nodes:
            self._lock_path(node, -1)

    def evict(self, num_tokens: int) -> int:
        """Release at least ``num_tokens`` tokens of unlocked leaves if possible; returns tokens released.

        Order: namespaces above their quota (most over first) down to their
        quota, then LRU across all namespaces. Slots go to ``free_fn``.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        self._spilling = True
        try:
            return self._evict_pressure(num_tokens)
        finally:
            self._spilling = False

    def set_spill(self, spill_fn: Callable[[str, array, tuple[int, ...]], None] | None) -> None:
        """Have ``evict`` hand each evicted leaf to ``spill_fn(owner, path, slots)`` before freeing it.

        ``owner`` is the leaf's namespace (``shared:<name>`` for a shared prefix); ``path`` is every token a
        request sends up to the leaf's end (for a continuation: the shared prefix, then its own tokens);
        ``slots`` hold its last ``len(slots)`` tokens and are freed when the eviction ends. Flush, quota and
        reset do not spill.
        """
        self._spill_fn = spill_fn

    def flush(self, ns: str) -> int:
        """Release all unlocked entries of ``ns``; returns tokens released through ``free_fn``.

        Flushing ``shared:<name>`` also flushes every tenant's continuations of
        that prefix (they are unreachable without it). Locked paths stay.
        """
        self._check_ns(ns, allow_shared=True)
        roots = self._owned_roots(ns)
        if ns.startswith(SHARED_NAMESPACE_PREFIX):
            roots += list(self._cont.get(ns[len(SHARED_NAMESPACE_PREFIX) :], {}).values())
        return self._evict_lru(self.total_size(), roots)

    def reset(self) -> None:
        """Release every entry through ``free_fn``. Config (quotas, policies, declarations) and counters stay.

        Raises:
            RuntimeError: some node is locked (its slots are in use); nothing is changed then.
        """
        if self.protected_size():
            raise RuntimeError(f"reset with locked entries: {self.protected_size()=}")
        nodes = [n for root in self._all_roots() for n in iter_subtree(root)]
        self._private.clear()
        self._cont.clear()
        for root in self._shared_roots.values():
            root.children.clear()
        for state in self._ns.values():
            state.evicted_tokens += state.evictable
            state.evictable = 0
            state.leaves.clear()
        self._evictable_total = 0
        self._leaves.clear()
        self._resident.clear()
        for node in nodes:
            node.parent = None
            node.children = {}
        for node in nodes:
            self._free_fn(node.value)

    def shared_route(self, ns: str, tokens: Sequence[int]) -> tuple[str, int] | None:
        """``(name, length)`` of the shared prefix a match of ``tokens`` by ``ns`` goes through, if any."""
        decl = self._route(ns, self._aligned(tokens))
        return (decl.name, len(decl.key)) if decl is not None else None

    def readable_shared(self, ns: str) -> list[str]:
        """Names of the declared shared prefixes ``ns`` may read (depends on configuration only)."""
        reg = self._registrations.get(ns)
        return [] if reg is None else [d.name for d in self._shared.values() if d.readable_by(reg)]

    # ------------------------------------------------------------------------------------------------ accounting

    def stats(self, ns: str) -> NamespaceStats:
        """Accounting snapshot of ``ns`` (zeros for an unknown namespace)."""
        self._check_ns(ns, allow_shared=True)
        state = self._ns.get(ns)
        return (state if state is not None else NamespaceState(ns)).snapshot()

    def evictable_size(self) -> int:
        return self._evictable_total

    def protected_size(self) -> int:
        return self._protected_total

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    def entries(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(owner namespace, slots)`` of every stored node (shared nodes: ``shared:<name>``), for audits and
        tests that compare another table with the tree. Mutates nothing; O(nodes)."""
        return [(n.owner, tuple(n.value)) for root in self._all_roots() for n in iter_subtree(root) if n is not root]

    @property
    def violations(self) -> int:
        """Isolation violations detected since construction (all namespaces)."""
        return self._violations

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` (with the numbers) if an internal invariant fails; see ``integrity``."""
        check_tree_integrity(self)

    # -------------------------------------------------------------------------------------------------- private

    def _enforce_quota(self, ns: str, ends: list[TreeNode]) -> None:
        state = self._ns[ns]
        if state.quota is None or state.resident <= state.quota:
            return
        # NOTE: lock the path just inserted, because the caller is still using those slots.
        fresh = NodeHandle(tuple(n for n in ends if not isinstance(n, RootNode)))
        self.inc_lock(fresh)
        try:
            self._evict_lru(state.resident - state.quota, ns)
        finally:
            self.dec_lock(fresh)

    def _evict_pressure(self, num_tokens: int) -> int:
        freed = 0
        stuck: set[str] = set()
        while freed < num_tokens:
            over = [
                (st.resident - st.quota, ns)
                for ns in self._quota_ns
                if (st := self._ns[ns]).quota is not None
                and st.resident > st.quota
                and st.evictable > 0
                and ns not in stuck
            ]
            if not over:
                break
            excess, ns = max(over)
            got = self._evict_lru(min(excess, num_tokens - freed), ns)
            if got == 0:
                stuck.add(ns)
            freed += got
        if freed < num_tokens:
            freed += self._evict_lru(num_tokens - freed, None)
        return freed
