"""Stateful property test of the tree plus its host tier: spills, load-backs, flushes, host pressure.

A fake byte store records, for every host page, which namespace's which prefix was copied into it. Oracle: a
load-back in ``ns`` for ``tokens`` only ever gets pages holding ``ns``'s own KV for exactly that prefix, and
every page leaving the host is scrubbed before it is reused.
"""

from __future__ import annotations

from array import array

from fake_pool import FakePool
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sglang_iso.cache import TenantRadixTree
from sglang_iso.cache.host_tier import HostTier

NAMESPACES = ("ns-a", "ns-b", "ns-c")


class HostMachine(RuleBasedStateMachine):
    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.pool = FakePool()
        self.tree = TenantRadixTree(self.page_size, self.pool.free)
        self.host: dict[int, tuple[str, tuple[int, ...]] | None] = {}  # host page -> (ns, prefix) or None (scrubbed)
        self.tier = HostTier(self.page_size, 6, self._scrub)
        self.tree.set_spill(self._spill)
        self.loaded = 0
        self.seen: list[list[int]] = []  # sequences inserted so far, in any namespace (probes reuse them)

    def _scrub(self, pages: list[int]) -> None:
        for page in pages:
            self.host[page] = None

    def _spill(self, ns: str, path: array, slots: tuple[int, ...]) -> None:
        start = len(path) - len(slots)
        for offset, page in self.tier.put(ns, path, start):
            assert self.host.get(page) is None, f"host page {page} reused without a scrub"
            self.host[page] = (ns, tuple(path[: offset + self.page_size]))

    def tokens(self) -> st.SearchStrategy[list[int]]:
        return st.lists(st.integers(0, 2), min_size=self.page_size, max_size=5 * self.page_size)

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data())
    def insert(self, ns: str, data: st.DataObject) -> None:
        tokens = data.draw(self.tokens())
        self.seen.append(tokens)
        found = self.tree.match(ns, tokens)
        slots = list(found.indices) + self.pool.alloc(len(tokens) - found.prefix_len)
        res = self.tree.insert(ns, tokens, slots)
        self.pool.free(list(res.duplicate_indices) + slots[res.stored_len :])

    @rule(n=st.integers(1, 12))
    def evict(self, n: int) -> None:
        self.tree.evict(n)

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data(), again=st.booleans())
    def load_back(self, ns: str, data: st.DataObject, again: bool) -> None:
        """What the adapter does on a match: take the host pages continuing the device prefix, check, insert."""
        # Mostly a sequence some namespace sent before (its own: a hit; another's: must miss).
        tokens = data.draw(st.sampled_from(self.seen) if again and self.seen else self.tokens())
        key = tokens[: len(tokens) - len(tokens) % self.page_size]
        found = self.tree.match(ns, key)
        pages = self.tier.take(ns, key, found.prefix_len)
        for i, page in enumerate(pages):
            end = found.prefix_len + (i + 1) * self.page_size
            # SECURITY oracle: only ns's own KV, computed for exactly this prefix.
            assert self.host[page] == (ns, tuple(key[:end])), (ns, key[:end], self.host[page])
        n = len(pages) * self.page_size
        if n:
            fresh = self.pool.alloc(n)
            res = self.tree.insert(ns, key[: found.prefix_len + n], [*found.indices, *fresh])
            assert res.stored_len == found.prefix_len + n and not res.duplicate_indices
            self.loaded += n
        self.tier.release(pages)
        assert all(self.host[p] is None for p in pages)

    @rule(ns=st.sampled_from(NAMESPACES))
    def flush(self, ns: str) -> None:
        self.tree.flush(ns)
        self.tier.flush(ns)
        assert self.tier.stats(ns).resident_tokens == 0

    @rule(ns=st.sampled_from(NAMESPACES), quota=st.none() | st.integers(0, 4), shared=st.booleans())
    def set_host_quota(self, ns: str, quota: int | None, shared: bool) -> None:
        # ns-a and ns-b may share one cap (one tenant's namespaces); ns-c is always alone.
        self.tier.set_quota(ns, quota, group="ab" if shared and ns != "ns-c" else None)
        assert quota is None or self.tier.group_resident_tokens(ns) <= quota

    @invariant()
    def integrity(self) -> None:
        self.tree.check_integrity()
        self.tier.check_integrity()
        for ns, index in self.tier._index.items():
            for page in index.values():
                entry = self.host[page]
                assert entry is not None and entry[0] == ns, (ns, page, entry)
        assert self.tier.violations == 0 and self.tree.violations == 0

    def teardown(self) -> None:
        self.tree.reset()
        self.tier.reset()
        assert not self.pool.live and self.tier.used_pages() == 0
        assert all(v is None for v in self.host.values())


class HostMachinePage2(HostMachine):
    page_size = 2


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestHostPage1 = HostMachine.TestCase
TestHostPage1.settings = SETTINGS
TestHostPage2 = HostMachinePage2.TestCase
TestHostPage2.settings = SETTINGS
