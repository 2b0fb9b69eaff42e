"""Unit tests of each TenantRadixTree operation within one namespace, at page sizes 1 and 4."""

from __future__ import annotations

import pytest
from fake_pool import FakePool

from sglang_iso.cache import InsertResult, TenantRadixTree
from sglang_iso.cache.node import TreeNode

NS = "ns-a"


def seq(page_size: int, *pages: int) -> list[int]:
    """Tokens made of whole pages; page ``p`` is ``[p*10, p*10+1, ...]``."""
    return [p * 10 + i for p in pages for i in range(page_size)]


def put(tree: TenantRadixTree, pool: FakePool, tokens: list[int], ns: str = NS) -> tuple[list[int], InsertResult]:
    slots = pool.alloc(len(tokens))
    res = tree.insert(ns, tokens, slots)
    pool.free(list(res.duplicate_indices) + slots[res.stored_len :])
    tree.check_integrity()
    return slots, res


def test_empty_tree_matches_nothing(tree: TenantRadixTree, page_size: int) -> None:
    res = tree.match(NS, seq(page_size, 1, 2))
    assert res.indices == () and res.prefix_len == 0 and res.last_node.is_empty
    tree.inc_lock(res.last_node)  # no-op on an empty handle
    tree.dec_lock(res.last_node)


def test_insert_then_match_full_and_partial(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tokens = seq(page_size, 1, 2, 3)
    slots, res = put(tree, pool, tokens)
    assert res == InsertResult(0, len(tokens), ())
    assert tree.match(NS, tokens).indices == tuple(slots)
    longer = tree.match(NS, [*tokens, *seq(page_size, 9)])
    assert longer.indices == tuple(slots) and longer.prefix_len == len(tokens)
    part = tree.match(NS, seq(page_size, 1, 2, 7))
    assert part.indices == tuple(slots[: 2 * page_size])
    tree.check_integrity()
    assert tree.total_size() == len(tokens) == tree.evictable_size()


def test_reinsert_reports_prefix_and_duplicates(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    first, _ = put(tree, pool, seq(page_size, 1, 2))
    second = pool.alloc(3 * page_size)
    res = tree.insert(NS, seq(page_size, 1, 2, 3), second)
    assert res.prefix_len == 2 * page_size and res.inserted_len == page_size
    assert res.duplicate_indices == tuple(second[: 2 * page_size])
    pool.free(list(res.duplicate_indices))
    assert tree.match(NS, seq(page_size, 1, 2, 3)).indices == tuple(first + second[2 * page_size :])


def test_reinsert_with_matched_slots_has_no_duplicates(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    first, _ = put(tree, pool, seq(page_size, 1, 2))
    cached = list(tree.match(NS, seq(page_size, 1, 2)).indices)
    extra = pool.alloc(page_size)
    assert cached == first
    res = tree.insert(NS, seq(page_size, 1, 2, 3), cached + extra)
    assert res == InsertResult(2 * page_size, page_size, ())


def test_diverging_insert_splits(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    a, _ = put(tree, pool, seq(page_size, 1, 2, 3))
    b, res = put(tree, pool, seq(page_size, 1, 5))
    assert res.prefix_len == page_size
    assert tree.match(NS, seq(page_size, 1, 2, 3)).indices == tuple(a)
    assert tree.match(NS, seq(page_size, 1, 5)).indices == tuple(a[:page_size] + b[page_size:])
    assert tree.total_size() == 4 * page_size


def test_only_whole_pages_are_stored() -> None:
    pool = FakePool()
    tree = TenantRadixTree(4, pool.free)
    slots = pool.alloc(6)
    res = tree.insert(NS, [1, 2, 3, 4, 5, 6], slots)
    assert res == InsertResult(0, 4, ())
    pool.free(slots[res.stored_len :])
    assert tree.match(NS, [1, 2, 3, 4, 5, 6, 7]).indices == tuple(slots[:4])
    assert tree.match(NS, [1, 2, 3]).prefix_len == 0
    tree.check_integrity()


def test_split_only_on_page_boundaries() -> None:
    pool = FakePool()
    tree = TenantRadixTree(4, pool.free)
    a = pool.alloc(8)
    tree.insert(NS, [1, 2, 3, 4, 5, 6, 7, 8], a)
    b = pool.alloc(8)
    res = tree.insert(NS, [1, 2, 3, 4, 5, 6, 0, 0], b)  # diverges inside the 2nd page
    assert res.prefix_len == 4 and res.duplicate_indices == tuple(b[:4])
    pool.free(list(res.duplicate_indices))
    assert tree.match(NS, [1, 2, 3, 4, 5, 6, 7, 8]).indices == tuple(a)
    assert tree.match(NS, [1, 2, 3, 4, 5, 6, 0, 0]).indices == tuple(a[:4] + b[4:])
    assert tree.match(NS, [1, 2, 3, 4, 5, 6, 9, 9]).indices == tuple(a[:4])
    tree.check_integrity()


def test_lock_moves_tokens_to_protected(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    put(tree, pool, seq(page_size, 1, 2))
    put(tree, pool, seq(page_size, 3))
    handle = tree.match(NS, seq(page_size, 1, 2)).last_node
    tree.inc_lock(handle)
    tree.check_integrity()
    assert tree.protected_size() == 2 * page_size and tree.evictable_size() == page_size
    assert tree.stats(NS).protected == 2 * page_size
    assert tree.evict(100 * page_size) == page_size  # only the unlocked leaf goes
    assert tree.match(NS, seq(page_size, 1, 2)).prefix_len == 2 * page_size
    tree.dec_lock(handle)
    tree.check_integrity()
    assert tree.evict(100 * page_size) == 2 * page_size
    assert tree.total_size() == 0 and not pool.live


def test_dec_lock_below_zero_is_an_error(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    put(tree, pool, seq(page_size, 1))
    handle = tree.match(NS, seq(page_size, 1)).last_node
    tree.inc_lock(handle)
    tree.dec_lock(handle)
    with pytest.raises(RuntimeError, match="below zero"):
        tree.dec_lock(handle)
    tree.check_integrity()
    assert tree.evictable_size() == page_size


def test_lock_survives_split(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    put(tree, pool, seq(page_size, 1, 2, 3))
    handle = tree.match(NS, seq(page_size, 1, 2, 3)).last_node
    tree.inc_lock(handle)
    put(tree, pool, seq(page_size, 1, 2, 8))  # splits the locked node
    assert tree.protected_size() == 3 * page_size
    tree.dec_lock(handle)
    tree.check_integrity()
    assert tree.protected_size() == 0


def test_stale_handle_is_rejected(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    put(tree, pool, seq(page_size, 1))
    handle = tree.match(NS, seq(page_size, 1)).last_node
    tree.evict(page_size)
    with pytest.raises(RuntimeError, match="stale"):
        tree.inc_lock(handle)
    other = TenantRadixTree(page_size, pool.free)
    put(tree, pool, seq(page_size, 1))
    with pytest.raises(RuntimeError, match="stale"):
        other.inc_lock(tree.match(NS, seq(page_size, 1)).last_node)


def test_evict_is_lru(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    old, _ = put(tree, pool, seq(page_size, 1))
    new, _ = put(tree, pool, seq(page_size, 2))
    tree.match(NS, seq(page_size, 1))  # touch: now the older one is 2
    assert tree.evict(1) == page_size
    assert pool.freed == new
    assert tree.match(NS, seq(page_size, 1)).indices == tuple(old)
    assert tree.stats(NS).evicted_tokens == page_size


def test_evict_cascades_to_parents(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    put(tree, pool, seq(page_size, 1, 2))
    put(tree, pool, seq(page_size, 1, 3))
    assert tree.evict(3 * page_size) == 3 * page_size
    assert tree.total_size() == 0 and not pool.live
    assert tree.evict(1) == 0


def test_one_eviction_releases_all_its_leaves_in_one_call(pool: FakePool, page_size: int) -> None:
    calls: list[list[int]] = []

    def free(slots: list[int]) -> None:
        calls.append(list(slots))
        pool.free(slots)

    tree = TenantRadixTree(page_size, free)
    kept, _ = put(tree, pool, seq(page_size, 9))
    evicted = [put(tree, pool, seq(page_size, 1, p))[0] for p in (2, 3, 4)]
    tree.match(NS, seq(page_size, 9))  # the newest: left alone
    calls.clear()  # (put frees the duplicates it was given)
    assert tree.evict(4 * page_size) == 4 * page_size  # three leaves, then their parent
    assert len(calls) == 1, "each release runs the allocator's defense layers: one per eviction"
    assert sorted(calls[0]) == sorted(evicted[0] + [s for slots in evicted[1:] for s in slots[page_size:]])
    assert tree.match(NS, seq(page_size, 9)).indices == tuple(kept)
    tree.check_integrity()


def test_an_eviction_that_fails_midway_frees_only_the_leaves_it_detached(
    tree: TenantRadixTree, pool: FakePool, page_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = put(tree, pool, seq(page_size, 1))
    second, _ = put(tree, pool, seq(page_size, 2))
    real = tree._remove_leaf
    calls: list[int] = []

    def remove_then_fail(node: TreeNode) -> list[TreeNode]:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("injected")
        return real(node)

    monkeypatch.setattr(tree, "_remove_leaf", remove_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        tree.evict(2 * page_size)
    monkeypatch.undo()
    assert pool.freed == first  # the detached leaf (the older one) went back to the allocator
    assert tree.match(NS, seq(page_size, 2)).indices == tuple(second)  # the other stayed, slots and all
    assert set(second) <= pool.live


def test_flush_drops_only_unlocked_entries_of_namespace(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    put(tree, pool, seq(page_size, 1, 2))
    keep, _ = put(tree, pool, seq(page_size, 3))
    other, _ = put(tree, pool, seq(page_size, 1, 2), ns="ns-b")
    handle = tree.match(NS, seq(page_size, 3)).last_node
    tree.inc_lock(handle)
    assert tree.flush(NS) == 2 * page_size
    tree.check_integrity()
    assert tree.match(NS, seq(page_size, 1, 2)).prefix_len == 0
    assert tree.match(NS, seq(page_size, 3)).indices == tuple(keep)
    assert tree.match("ns-b", seq(page_size, 1, 2)).indices == tuple(other)
    tree.dec_lock(handle)


def test_reset_frees_everything_and_refuses_when_locked(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    put(tree, pool, seq(page_size, 1, 2))
    put(tree, pool, seq(page_size, 4), ns="ns-b")
    handle = tree.match(NS, seq(page_size, 1)).last_node
    tree.inc_lock(handle)
    with pytest.raises(RuntimeError, match="locked"):
        tree.reset()
    tree.check_integrity()
    tree.dec_lock(handle)
    tree.reset()
    tree.check_integrity()
    assert tree.total_size() == 0 and not pool.live
    assert tree.match(NS, seq(page_size, 1, 2)).prefix_len == 0
    with pytest.raises(RuntimeError, match="stale"):
        tree.inc_lock(handle)


def test_policy_off_stores_and_matches_nothing(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tokens = seq(page_size, 1)
    put(tree, pool, tokens)
    tree.set_policy(NS, "off")
    slots = pool.alloc(page_size)
    assert tree.insert(NS, seq(page_size, 2), slots) == InsertResult(0, 0, ())
    pool.free(slots)  # the caller keeps (and here frees) its slots
    assert tree.match(NS, tokens).prefix_len == 0
    tree.set_policy(NS, "private")  # positive control: entries stayed
    assert tree.match(NS, tokens).prefix_len == page_size
    assert tree.match(NS, seq(page_size, 2)).prefix_len == 0
    with pytest.raises(ValueError, match="private"):
        tree.set_policy(NS, "shared")  # type: ignore[arg-type]


def test_stats_count_hits_and_lookups(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    put(tree, pool, seq(page_size, 1, 2))
    tree.match(NS, seq(page_size, 1, 9))
    stats = tree.stats(NS)
    assert stats.hit_tokens == page_size and stats.lookup_tokens == 2 * page_size
    assert stats.inserted_tokens == stats.resident == stats.evictable == 2 * page_size
    assert tree.stats("ns-unknown").resident == 0


def test_an_uncounted_match_finds_the_same_and_leaves_the_counters(
    tree: TenantRadixTree, pool: FakePool, page_size: int
) -> None:
    put(tree, pool, seq(page_size, 1, 2))
    before = tree.stats(NS)
    quiet = tree.match(NS, seq(page_size, 1, 2), count=False)
    assert quiet.prefix_len == 2 * page_size and tree.stats(NS) == before
    counted = tree.match(NS, seq(page_size, 1, 2))  # positive control: the same lookup, counted
    assert list(counted.indices) == list(quiet.indices)
    stats = tree.stats(NS)
    assert stats.hit_tokens == before.hit_tokens + 2 * page_size
    assert stats.lookup_tokens == before.lookup_tokens + 2 * page_size


def test_bad_arguments(tree: TenantRadixTree, page_size: int) -> None:
    with pytest.raises(ValueError, match="one index per token"):
        tree.insert(NS, [1, 2], [1])
    for bad in ("", "shared:x"):
        with pytest.raises(ValueError, match="namespace"):
            tree.match(bad, [1])
    with pytest.raises(ValueError, match="num_tokens"):
        tree.evict(-1)
    with pytest.raises(ValueError, match="page_size"):
        TenantRadixTree(0, lambda slots: None)


def test_resident_slot_reuse_is_refused(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    slots, _ = put(tree, pool, seq(page_size, 1))
    res = tree.insert("ns-b", seq(page_size, 7), slots)  # a buggy caller passes slots the cache owns
    assert res == InsertResult(0, 0, ())
    assert tree.violations == 1 and tree.stats("ns-b").violations == 1
    assert tree.match("ns-b", seq(page_size, 7)).prefix_len == 0
    assert tree.match(NS, seq(page_size, 1)).indices == tuple(slots)  # positive control
