"""Stateful property test of TenantRadixTree against a reference model of who inserted what.

The model keeps, per segment, the slots stored for each page (keyed by the prefix ending with it)::

    ("p", ns)   tokens                 ns's private entries
    ("s",)      tokens[:len(SHARED)]   the shared prefix (filled by the first reader)
    ("c", ns)   tokens[len(SHARED):]   ns's continuations after the shared prefix

Entries leave the model only when the tree hands their slots to ``free_fn``.
"""

from __future__ import annotations

from fake_pool import FakePool
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sglang_iso.cache import InsertResult, NodeHandle, TenantRadixTree

NAMESPACES = ("ns-a", "ns-b", "ns-c")
TENANTS = {"ns-a": "a", "ns-b": "b", "ns-c": "c"}
READERS = frozenset({"a", "b"})

Segment = tuple[str, ...]


class TreeMachine(RuleBasedStateMachine):
    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.pool = FakePool()
        self.tree = TenantRadixTree(self.page_size, self._free)
        self.shared = tuple([5] * self.page_size + [6] * self.page_size)
        self.entries: dict[tuple[Segment, tuple[int, ...]], tuple[int, ...]] = {}
        self.resident: set[int] = set()
        self.locks: list[tuple[NodeHandle, tuple[int, ...]]] = []
        self.off: set[str] = set()

    # ------------------------------------------------------------------------------------------------- model

    def _free(self, slots: list[int]) -> None:
        locked = {s for _, indices in self.locks for s in indices}
        for slot in slots:
            assert slot in self.resident, f"free_fn got a slot that is not resident: {slot=}"
            assert slot not in locked, f"free_fn got a locked slot: {slot=}"
            self.resident.remove(slot)
        gone = set(slots)
        self.entries = {k: v for k, v in self.entries.items() if gone.isdisjoint(v)}
        self.pool.free(slots)

    def _segments(self, ns: str, key: tuple[int, ...]) -> list[tuple[Segment, tuple[int, ...]]]:
        n = len(self.shared)
        if TENANTS[ns] in READERS and key[:n] == self.shared:
            return [(("s",), key[:n]), (("c", ns), key[n:])]
        return [(("p", ns), key)]

    def _present(self, segment: Segment, key: tuple[int, ...]) -> list[int]:
        out: list[int] = []
        for end in range(self.page_size, len(key) + 1, self.page_size):
            slots = self.entries.get((segment, key[:end]))
            if slots is None:
                break
            out += slots
        return out

    def _expected_match(self, ns: str, key: tuple[int, ...]) -> list[int]:
        if ns in self.off:
            return []
        segs = self._segments(ns, key)
        if len(segs) == 2 and len(self._present(*segs[0])) < len(self.shared):
            return []
        out: list[int] = []
        for segment, part in segs:
            out += self._present(segment, part)
        return out

    def _aligned(self, tokens: list[int]) -> tuple[int, ...]:
        return tuple(tokens[: len(tokens) - len(tokens) % self.page_size])

    # ------------------------------------------------------------------------------------------------- rules

    @initialize()
    def setup(self) -> None:
        for ns in NAMESPACES:
            self.tree.register_namespace(ns, tenant_id=TENANTS[ns], scope="s")
        self.tree.declare_shared("sys", self.shared, READERS, scope="s")

    def tokens(self) -> st.SearchStrategy[list[int]]:
        body = st.lists(st.integers(0, 2), max_size=4 * self.page_size)
        head = st.sampled_from([(), self.shared, self.shared[: self.page_size]])
        return st.tuples(head, body).map(lambda hb: list(hb[0]) + hb[1])

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data(), reuse=st.booleans())
    def insert(self, ns: str, data: st.DataObject, reuse: bool) -> None:
        tokens = data.draw(self.tokens())
        key = self._aligned(tokens)
        cached = self._expected_match(ns, key) if reuse else []
        if reuse:
            assert list(self.tree.match(ns, tokens).indices) == cached
        slots = cached + self.pool.alloc(len(tokens) - len(cached))
        expected_new = 0 if ns in self.off else len(key)
        prefix: list[int] = []
        if ns not in self.off:
            segs = self._segments(ns, key)
            head = self._present(*segs[0])
            if len(segs) == 1 or len(head) == len(self.shared):
                prefix = self._expected_match(ns, key)
            expected_new = len(key) - len(prefix)
        dups = tuple(s for s, c in zip(slots, prefix, strict=False) if s != c)
        before = dict(self.entries)
        res = self.tree.insert(ns, tokens, slots)
        assert res == InsertResult(len(prefix), expected_new, dups), (res, len(prefix), expected_new)
        if expected_new:
            pos = 0
            for segment, part in self._segments(ns, key):
                for end in range(self.page_size, len(part) + 1, self.page_size):
                    k = (segment, part[:end])
                    if k not in before:
                        page = tuple(slots[pos + end - self.page_size : pos + end])
                        self.entries[k] = page
                        self.resident.update(page)
                pos += len(part)
        self.pool.free(list(res.duplicate_indices) + slots[res.stored_len :])

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data(), lock=st.booleans())
    def match(self, ns: str, data: st.DataObject, lock: bool) -> None:
        tokens = data.draw(self.tokens())
        res = self.tree.match(ns, tokens)
        assert list(res.indices) == self._expected_match(ns, self._aligned(tokens))
        assert res.prefix_len == len(res.indices)
        if lock:
            self.tree.inc_lock(res.last_node)
            self.locks.append((res.last_node, res.indices))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        handle, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.tree.dec_lock(handle)

    @rule(n=st.integers(0, 12))
    def evict(self, n: int) -> None:
        before = self.tree.total_size()
        freed = self.tree.evict(n)
        assert before - self.tree.total_size() == freed
        assert freed >= n or self.tree.evictable_size() == 0 or self._shared_blocked()

    def _shared_blocked(self) -> bool:
        return self.tree.evictable_size() == self.tree.stats("shared:sys").evictable

    @rule(ns=st.sampled_from([*NAMESPACES, "shared:sys"]))
    def flush(self, ns: str) -> None:
        self.tree.flush(ns)

    @rule(ns=st.sampled_from(NAMESPACES), quota=st.none() | st.integers(0, 8))
    def set_quota(self, ns: str, quota: int | None) -> None:
        self.tree.set_quota(ns, quota)

    @rule(ns=st.sampled_from(NAMESPACES), off=st.booleans())
    def set_policy(self, ns: str, off: bool) -> None:
        self.tree.set_policy(ns, "off" if off else "private")
        (self.off.add if off else self.off.discard)(ns)

    # --------------------------------------------------------------------------------------------- invariants

    @invariant()
    def integrity(self) -> None:
        self.tree.check_integrity()
        assert self.tree.total_size() == len(self.resident)
        assert self.tree.violations == 0

    def teardown(self) -> None:
        for handle, _ in self.locks:
            self.tree.dec_lock(handle)
        self.locks.clear()
        self.tree.reset()
        assert not self.resident and not self.pool.live, f"leaked slots: {sorted(self.pool.live)[:10]}"


class TreeMachinePage2(TreeMachine):
    page_size = 2


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestTreePage1 = TreeMachine.TestCase
TestTreePage1.settings = SETTINGS
TestTreePage2 = TreeMachinePage2.TestCase
TestTreePage2.settings = SETTINGS
