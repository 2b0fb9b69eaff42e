"""Operator-declared shared prefixes: readers share the prefix, continuations stay private."""

from __future__ import annotations

import pytest
from fake_pool import FakePool

from sglang_iso.cache import InsertResult, TenantRadixTree

A, B, C, D = "ns-a", "ns-b", "ns-c", "ns-d"
SHARED_NS = "shared:sys"


def system(page_size: int) -> list[int]:
    return [1000 + i for i in range(2 * page_size)]


def tail(page_size: int, start: int) -> list[int]:
    return [start + i for i in range(page_size)]


@pytest.fixture
def shared_tree(tree: TenantRadixTree, page_size: int) -> TenantRadixTree:
    tree.register_namespace(A, tenant_id="a", scope="s")
    tree.register_namespace(B, tenant_id="b", scope="s")
    tree.register_namespace(C, tenant_id="c", scope="s")  # not a reader
    tree.register_namespace(D, tenant_id="a", scope="other-model")  # reader tenant, incompatible KV
    assert tree.declare_shared("sys", system(page_size), frozenset({"a", "b"}), scope="s") == SHARED_NS
    return tree


def fill(tree: TenantRadixTree, pool: FakePool, ns: str, tokens: list[int]) -> tuple[list[int], InsertResult]:
    slots = pool.alloc(len(tokens))
    res = tree.insert(ns, tokens, slots)
    pool.free(list(res.duplicate_indices) + slots[res.stored_len :])
    tree.check_integrity()
    return slots, res


def test_first_reader_fills_shared_part(shared_tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree, n = shared_tree, 2 * page_size
    prompt = system(page_size) + tail(page_size, 1)
    slots, res = fill(tree, pool, A, prompt)
    assert res == InsertResult(0, len(prompt), ())
    assert tree.stats(SHARED_NS).resident == n and tree.stats(A).resident == page_size
    assert tree.match(A, prompt).indices == tuple(slots)
    hit = tree.match(B, system(page_size) + tail(page_size, 2))
    assert hit.indices == tuple(slots[:n])  # B reads the shared part only
    assert tree.stats(SHARED_NS).hit_tokens == 2 * n


def test_continuations_stay_private(shared_tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree, n = shared_tree, 2 * page_size
    prompt = system(page_size) + tail(page_size, 1)
    a_slots, _ = fill(tree, pool, A, prompt)
    assert tree.match(B, prompt).prefix_len == n  # B sees the shared part, not A's continuation
    b_slots, res = fill(tree, pool, B, prompt)
    assert res.prefix_len == n and res.inserted_len == page_size
    assert res.duplicate_indices == tuple(b_slots[:n])
    assert tree.match(B, prompt).indices == tuple(a_slots[:n] + b_slots[n:])
    assert tree.match(A, prompt).indices == tuple(a_slots)  # positive control
    assert tree.stats(A).resident == tree.stats(B).resident == page_size


def test_non_reader_gets_nothing(shared_tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree = shared_tree
    prompt = system(page_size) + tail(page_size, 1)
    a_slots, _ = fill(tree, pool, A, prompt)
    for ns in (C, D, "ns-unregistered"):
        assert tree.match(ns, prompt).prefix_len == 0, ns
    assert tree.match(A, prompt).indices == tuple(a_slots)  # positive control
    c_slots, res = fill(tree, pool, C, prompt)  # a non-reader caches privately
    assert res == InsertResult(0, len(prompt), ())
    assert tree.match(C, prompt).indices == tuple(c_slots)
    assert tree.stats(SHARED_NS).resident == 2 * page_size


def test_wildcard_readers_within_scope(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree.register_namespace(A, tenant_id="a", scope="s")
    tree.register_namespace(C, tenant_id="c", scope="s")
    tree.register_namespace(D, tenant_id="d", scope="other")
    tree.declare_shared("all", system(page_size), "*", scope="s")
    slots, _ = fill(tree, pool, A, system(page_size))
    assert tree.match(C, system(page_size)).indices == tuple(slots)
    assert tree.match(D, system(page_size)).prefix_len == 0


def test_only_declared_tokens_are_shared(shared_tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree = shared_tree
    short = system(page_size)[:page_size]
    fill(tree, pool, A, short)  # shorter than the shared prefix: private
    assert tree.stats(SHARED_NS).resident == 0
    assert tree.match(B, short).prefix_len == 0
    assert tree.match(A, short).prefix_len == page_size  # positive control


def test_lock_covers_both_segments(shared_tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree = shared_tree
    prompt = system(page_size) + tail(page_size, 1)
    fill(tree, pool, A, prompt)
    handle = tree.match(A, prompt).last_node
    assert len(handle.nodes) == 2
    tree.inc_lock(handle)
    tree.check_integrity()
    assert tree.evict(10**6) == 0
    assert tree.stats(SHARED_NS).protected == 2 * page_size and tree.stats(A).protected == page_size
    tree.dec_lock(handle)
    tree.check_integrity()
    assert tree.evict(10**6) == 3 * page_size and not pool.live


def test_shared_node_outlives_continuations(shared_tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree = shared_tree
    fill(tree, pool, A, system(page_size) + tail(page_size, 1))
    fill(tree, pool, B, system(page_size) + tail(page_size, 2))
    tree.set_quota(SHARED_NS, 0)  # the shared namespace is the most over quota...
    assert tree.evict(1) == page_size  # ...but a continuation must go before the node it hangs off
    tree.check_integrity()
    assert tree.stats(SHARED_NS).resident == 2 * page_size
    assert tree.evict(2 * page_size) == 3 * page_size  # last continuation, then the shared node
    assert tree.total_size() == 0


def test_flush_shared_drops_continuations(shared_tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree = shared_tree
    fill(tree, pool, A, system(page_size) + tail(page_size, 1))
    own, _ = fill(tree, pool, A, tail(page_size, 5))
    assert tree.flush(SHARED_NS) == 3 * page_size
    assert tree.match(A, system(page_size) + tail(page_size, 1)).prefix_len == 0
    assert tree.match(A, tail(page_size, 5)).indices == tuple(own)


def test_flush_tenant_keeps_shared(shared_tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tree = shared_tree
    fill(tree, pool, A, system(page_size) + tail(page_size, 1))
    assert tree.flush(A) == page_size
    assert tree.match(B, system(page_size)).prefix_len == 2 * page_size


def test_policy_off_on_shared_namespace_disables_sharing(
    shared_tree: TenantRadixTree, pool: FakePool, page_size: int
) -> None:
    tree = shared_tree
    fill(tree, pool, A, system(page_size))
    tree.set_policy(SHARED_NS, "off")
    assert tree.match(B, system(page_size)).prefix_len == 0
    tree.set_policy(SHARED_NS, "private")
    assert tree.match(B, system(page_size)).prefix_len == 2 * page_size


def test_declare_validation(tree: TenantRadixTree, page_size: int) -> None:
    tree.declare_shared("sys", system(page_size), "*", scope="s")
    with pytest.raises(ValueError, match="already declared"):
        tree.declare_shared("sys", system(page_size), "*", scope="s")
    with pytest.raises(ValueError, match="shared name"):
        tree.declare_shared("Bad Name", system(page_size), "*", scope="s")
    with pytest.raises(ValueError, match="readers"):
        tree.declare_shared("r", system(page_size), {"a"}, scope="s")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple"):
        tree.declare_shared("empty", [], "*", scope="s")
    if page_size > 1:
        with pytest.raises(ValueError, match="multiple"):
            tree.declare_shared("odd", [1] * (page_size + 1), "*", scope="s")
    with pytest.raises(ValueError, match="unknown shared"):
        tree.stats("shared:nope")
    tree.register_namespace(A, tenant_id="a", scope="s")
    with pytest.raises(ValueError, match="already registered"):
        tree.register_namespace(A, tenant_id="b", scope="s")
