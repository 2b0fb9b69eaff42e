"""The host (L2) tier's bookkeeping and the tree's spill hook, without torch or SGLang."""

from __future__ import annotations

from array import array

import pytest
from fake_pool import FakePool

from sglang_iso.cache import TenantRadixTree
from sglang_iso.cache.host_tier import HostTier

A, B = "ns-a", "ns-b"


def seq(page_size: int, *pages: int) -> list[int]:
    return [p * 10 + i for p in pages for i in range(page_size)]


class Host:
    """A host tier plus a fake byte store: page -> (namespace, tokens) it holds, or None once scrubbed."""

    def __init__(self, page_size: int, capacity: int) -> None:
        self.bytes: dict[int, object] = {}
        self.scrubbed: list[int] = []
        self.tier = HostTier(page_size, capacity, self.scrub)

    def scrub(self, pages: list[int]) -> None:
        self.scrubbed += pages
        for p in pages:
            self.bytes[p] = None

    def spill(self, ns: str, path: array, slots: tuple[int, ...]) -> None:
        start = len(path) - len(slots)
        for offset, page in self.tier.put(ns, path, start):
            self.bytes[page] = (ns, tuple(path[offset : offset + self.tier.page_size]))


@pytest.fixture(params=[1, 4], ids=["page1", "page4"])
def page_size(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def test_spill_then_take_in_own_namespace_only(page_size: int) -> None:
    pool, host = FakePool(), Host(page_size, 64)
    tree = TenantRadixTree(page_size, pool.free)
    tree.set_spill(host.spill)
    tokens = seq(page_size, 1, 2, 3)
    tree.insert(A, tokens, pool.alloc(len(tokens)))
    assert tree.evict(len(tokens)) == len(tokens)
    tree.check_integrity()
    host.tier.check_integrity()
    assert host.tier.stats(A).resident_tokens == len(tokens)
    # B, same tokens: nothing (separate index, unrelated digests). A: every page, in order.
    assert host.tier.lookup(B, tokens, 0) == []
    pages = host.tier.take(A, tokens, 0)
    assert [host.bytes[p] for p in pages] == [(A, tuple(tokens[i : i + page_size])) for i in range(0, 12, page_size)][
        : len(pages)
    ]
    assert len(pages) * page_size == len(tokens)
    host.tier.release(pages)
    assert set(pages) <= set(host.scrubbed) and all(host.bytes[p] is None for p in pages)
    assert host.tier.stats(A) == (0, len(tokens), len(tokens))
    host.tier.check_integrity()


def test_spill_only_under_device_pressure(page_size: int) -> None:
    pool, host = FakePool(), Host(page_size, 64)
    tree = TenantRadixTree(page_size, pool.free)
    tree.set_spill(host.spill)
    tokens = seq(page_size, 1, 2)
    tree.insert(A, tokens, pool.alloc(len(tokens)))
    tree.flush(A)
    assert host.tier.stats(A).written_tokens == 0
    tree.insert(A, tokens, pool.alloc(len(tokens)))
    tree.set_quota(A, 0)
    tree.insert(A, seq(page_size, 5), pool.alloc(page_size))  # quota eviction: no spill either
    assert host.tier.stats(A).written_tokens == 0


def test_partial_chain_and_later_pages(page_size: int) -> None:
    pool, host = FakePool(), Host(page_size, 64)
    tree = TenantRadixTree(page_size, pool.free)
    tree.set_spill(host.spill)
    base = seq(page_size, 1, 2)
    tree.insert(A, base, pool.alloc(len(base)))
    longer = [*base, *seq(page_size, 3, 4)]
    tree.insert(A, longer, [*tree.match(A, base).indices, *pool.alloc(2 * page_size)])
    # Evict only the tail leaf: the host holds pages 3, 4 keyed by the full prefix.
    assert tree.evict(1) == 2 * page_size
    found = tree.match(A, longer)
    assert found.prefix_len == len(base)
    assert len(host.tier.lookup(A, longer, found.prefix_len)) == 2
    # A different prefix with the same tail tokens does not see them (chained digests).
    other = [*seq(page_size, 7, 8), *seq(page_size, 3, 4)]
    assert host.tier.lookup(A, other, len(base)) == []


def test_lru_drop_and_flush_scrub(page_size: int) -> None:
    host = Host(page_size, 4)
    t = host.tier
    a_path = array("q", seq(page_size, 1, 2, 3))
    host.spill(A, a_path, (0,) * len(a_path))
    b_path = array("q", seq(page_size, 4, 5))
    host.spill(B, b_path, (0,) * len(b_path))  # host full: A's LRU page is dropped
    t.check_integrity()
    assert t.dropped_pages == 1 and t.used_pages() == 4
    assert t.lookup(A, a_path, 0) == []  # the chain's first page is gone: nothing reachable from the start
    assert t.flush(B) == 2 * page_size
    assert t.stats(B).resident_tokens == 0 and len(host.scrubbed) == 3
    t.reset()
    assert t.used_pages() == 0 and len(host.scrubbed) == 5
    t.check_integrity()


def test_long_chain_never_drops_its_own_pages(page_size: int) -> None:
    host = Host(page_size, 2)
    path = array("q", seq(page_size, 1, 2, 3, 4))
    placed = host.tier.put(A, path, 0)
    assert [off for off, _ in placed] == [0, page_size]
    host.tier.check_integrity()


def test_forged_owner_tag_is_a_counted_miss(page_size: int) -> None:
    host = Host(page_size, 8)
    path = array("q", seq(page_size, 1, 2))
    host.spill(A, path, (0,) * len(path))
    page = host.tier.lookup(A, path, 0)[0]
    host.tier._owner[page] = (B, b"x")  # a corrupted tag
    assert host.tier.lookup(A, path, 0) == []
    assert host.tier.violations == 1


def test_digests_depend_on_namespace() -> None:
    t = HostTier(2, 1, lambda pages: None)
    assert t.chain(A, [1, 2, 3, 4], 4) != t.chain(B, [1, 2, 3, 4], 4)
    assert t.chain(A, [1, 2, 3, 4], 4)[0] == t.chain(A, [1, 2, 9, 9], 4)[0]
    with pytest.raises(ValueError):
        HostTier(0, 1, lambda pages: None)


def test_quota_drops_own_lru_pages_only(page_size: int) -> None:
    host = Host(page_size, 16)
    t = host.tier
    b_path = array("q", seq(page_size, 7))
    host.spill(B, b_path, (0,) * len(b_path))
    t.set_quota(A, 2 * page_size)
    first = array("q", seq(page_size, 1, 2))
    host.spill(A, first, (0,) * len(first))
    second = array("q", seq(page_size, 4, 5))
    host.spill(A, second, (0,) * len(second))  # A is at its quota: its own oldest pages go, never B's
    t.check_integrity()
    assert t.stats(A).resident_tokens == 2 * page_size and len(t.lookup(A, second, 0)) == 2
    assert t.lookup(A, first, 0) == [] and len(t.lookup(B, b_path, 0)) == 1
    t.set_quota(A, page_size)  # lowering the cap trims at once
    assert t.stats(A).resident_tokens == page_size
    t.set_quota(A, 0)
    assert t.put(A, first, 0) == [] and t.stats(A).resident_tokens == 0
    t.set_quota(A, None)
    assert len(t.put(A, first, 0)) == 2
    t.check_integrity()


def test_group_quota_caps_a_tenants_namespaces_together(page_size: int) -> None:
    host = Host(page_size, 16)
    t = host.tier
    c_path = array("q", seq(page_size, 7))
    host.spill("ns-c", c_path, (0,) * len(c_path))  # another tenant's page, older than all of A's
    a_path = array("q", seq(page_size, 1, 2))
    host.spill(A, a_path, (0,) * len(a_path))  # placed before A had a group: moves into the group
    t.set_quota(A, 3 * page_size, group="tenant-1")
    t.set_quota(B, 3 * page_size, group="tenant-1")
    b_path = array("q", seq(page_size, 4, 5))
    host.spill(B, b_path, (0,) * len(b_path))  # 4 pages in the group: A's oldest goes, never ns-c's
    t.check_integrity()
    assert t.group_resident_tokens(A) == t.group_resident_tokens(B) == 3 * page_size
    assert len(t.lookup(A, a_path, 0)) == 0 and t.stats(A).resident_tokens == page_size
    assert len(t.lookup("ns-c", c_path, 0)) == 1
    t.set_quota(A, page_size, group="other")  # a namespace keeps its first group; lowering trims the group
    assert t.group_resident_tokens(B) == page_size
    assert len(t.lookup("ns-c", c_path, 0)) == 1
    t.check_integrity()


def test_lazy_chain_matches_the_eager_one() -> None:
    t = HostTier(2, 1, lambda pages: None)
    tokens = [3, 1, 4, 1, 5, 9, 2]
    lazy = t.lazy_chain(A, tokens)
    assert len(lazy) == 3 and lazy[2] == t.chain(A, tokens, 6)[2]  # out of order: computes the prefix first
    assert [lazy[i] for i in range(3)] == t.chain(A, tokens, 6)
    with pytest.raises(IndexError):
        lazy[3]


def test_shared_prefix_and_continuations_spill_under_their_own_namespaces(page_size: int) -> None:
    pool, host = FakePool(), Host(page_size, 64)
    tree = TenantRadixTree(page_size, pool.free)
    tree.set_spill(host.spill)
    tree.register_namespace(A, tenant_id="a", scope="s")
    tree.register_namespace(B, tenant_id="b", scope="s")  # not a reader
    head = seq(page_size, 8, 9)
    tree.declare_shared("sys", head, frozenset({"a"}), scope="s")
    full = head + seq(page_size, 1)
    tree.insert(A, full, pool.alloc(len(full)))
    assert tree.evict(len(full)) == len(full)  # the continuation goes first, then the shared node
    tree.check_integrity()
    host.tier.check_integrity()
    # The shared prefix is kept as "shared:sys" (exactly its tokens), the continuation under A, chained from
    # the shared prefix's first token; B's namespace holds nothing.
    assert len(host.tier.lookup("shared:sys", head, 0)) == len(head) // page_size
    assert len(host.tier.lookup(A, full, len(head))) == 1
    assert host.tier.lookup(A, full, 0) == [] and not host.tier.holds(B)
    assert host.tier.stats("shared:sys").resident_tokens == len(head)
