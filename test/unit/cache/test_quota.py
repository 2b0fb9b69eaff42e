"""Per-namespace quotas: own inserts evict own entries; eviction pressure hits over-quota namespaces first."""

from __future__ import annotations

import pytest
from fake_pool import FakePool

from sglang_iso.cache import TenantRadixTree

A, B, C = "ns-a", "ns-b", "ns-c"


def page(page_size: int, p: int) -> list[int]:
    return [p * 100 + i for i in range(page_size)]


def fill(tree: TenantRadixTree, pool: FakePool, ns: str, tokens: list[int]) -> list[int]:
    slots = pool.alloc(len(tokens))
    res = tree.insert(ns, tokens, slots)
    pool.free(list(res.duplicate_indices) + slots[res.stored_len :])
    tree.check_integrity()
    return slots


def test_own_insert_over_quota_evicts_own_lru(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree.set_quota(A, 2 * page_size)
    other = fill(tree, pool, B, page(page_size, 9))
    first = fill(tree, pool, A, page(page_size, 1))
    fill(tree, pool, A, page(page_size, 2))
    newest = fill(tree, pool, A, page(page_size, 3))  # over quota: A's LRU entry goes
    assert pool.freed == first
    assert tree.stats(A).resident == 2 * page_size
    assert tree.match(A, page(page_size, 3)).indices == tuple(newest)
    assert tree.match(B, page(page_size, 9)).indices == tuple(other)  # other namespace untouched


def test_insert_never_evicts_the_path_just_inserted(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree.set_quota(A, 0)
    slots = fill(tree, pool, A, page(page_size, 1) + page(page_size, 2))
    assert tree.match(A, page(page_size, 1) + page(page_size, 2)).indices == tuple(slots)
    assert pool.freed == []
    fill(tree, pool, A, page(page_size, 3))  # the older entry is evicted now, best effort
    assert tree.stats(A).resident == page_size


def test_quota_is_best_effort_with_locks(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree.set_quota(A, page_size)
    fill(tree, pool, A, page(page_size, 1))
    handle = tree.match(A, page(page_size, 1)).last_node
    tree.inc_lock(handle)
    fill(tree, pool, A, page(page_size, 2))
    assert tree.stats(A).resident == 2 * page_size  # nothing evictable but the fresh path
    tree.dec_lock(handle)


def test_evict_prefers_over_quota_namespace(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    b_old = fill(tree, pool, B, page(page_size, 1))  # oldest entry overall, B under quota
    fill(tree, pool, A, page(page_size, 2))
    fill(tree, pool, A, page(page_size, 3))
    tree.set_quota(A, page_size)  # A is now over quota; setting it evicts nothing by itself
    assert tree.stats(A).resident == 2 * page_size
    assert tree.evict(1) == page_size
    assert tree.stats(A).resident == page_size
    assert not set(b_old) & set(pool.freed)
    assert tree.evict(1) == page_size  # nobody is over quota now: global LRU takes B's old entry
    assert pool.freed[-page_size:] == b_old


def test_most_over_quota_goes_first(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    for p in range(3):
        fill(tree, pool, A, page(page_size, 10 + p))
    b = [fill(tree, pool, B, page(page_size, 20 + p)) for p in range(4)]
    tree.set_quota(A, 2 * page_size)  # 1 page over
    tree.set_quota(B, page_size)  # 3 pages over
    assert tree.evict(2 * page_size) == 2 * page_size
    assert pool.freed == b[0] + b[1]
    assert tree.evict(2 * page_size) == 2 * page_size  # B and A both 1 over now
    assert tree.stats(A).resident == 2 * page_size and tree.stats(B).resident == page_size
    assert tree.stats(C).resident == 0


def test_quota_validation(tree: TenantRadixTree) -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="quota"):
            tree.set_quota(A, bad)  # type: ignore[arg-type]
    tree.set_quota(A, None)
    assert tree.stats(A).quota is None
