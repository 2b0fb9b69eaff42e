"""Isolation between namespaces. Every negative check is paired with a same-namespace positive control."""

from __future__ import annotations

import logging

import pytest
from fake_pool import FakePool

from sglang_iso.cache import TenantRadixTree
from sglang_iso.cache.node import TreeNode, page_key
from sglang_iso.identity import CacheIdentity, NamespaceKeyer

A, B = "ns-a", "ns-b"


def fill(tree: TenantRadixTree, pool: FakePool, ns: str, tokens: list[int]) -> list[int]:
    slots = pool.alloc(len(tokens))
    res = tree.insert(ns, tokens, slots)
    pool.free(list(res.duplicate_indices) + slots[res.stored_len :])
    return slots


def test_other_namespace_never_hits(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tokens = list(range(3 * page_size))
    slots = fill(tree, pool, A, tokens)
    assert tree.match(A, tokens).indices == tuple(slots)  # positive control
    miss = tree.match(B, tokens)
    assert miss.prefix_len == 0 and miss.indices == () and miss.last_node.is_empty
    assert tree.stats(B).hit_tokens == 0 and tree.violations == 0


def test_same_tokens_get_separate_entries(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tokens = list(range(2 * page_size))
    a = fill(tree, pool, A, tokens)
    b_slots = pool.alloc(len(tokens))
    res = tree.insert(B, tokens, b_slots)
    assert res.prefix_len == 0 and res.inserted_len == len(tokens)  # A's entry does not count as "present" for B
    assert tree.match(A, tokens).indices == tuple(a)
    assert tree.match(B, tokens).indices == tuple(b_slots)
    assert tree.stats(A).resident == tree.stats(B).resident == len(tokens)


def test_eviction_of_one_namespace_leaves_other_intact(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tokens = list(range(page_size))
    a = fill(tree, pool, A, tokens)
    fill(tree, pool, B, tokens)
    tree.flush(B)
    assert tree.match(B, tokens).prefix_len == 0
    assert tree.match(A, tokens).indices == tuple(a)


def test_cache_salt_and_adapter_make_separate_namespaces(pool: FakePool) -> None:
    keyer = NamespaceKeyer(b"s" * 32)
    base = dict(tenant_id="acme", model_fingerprint="m", tokenizer_fingerprint="t", kv_dtype="bf16", page_size=1)
    plain = keyer.namespace_id(CacheIdentity(adapter_id=None, adapter_version=None, **base))  # type: ignore[arg-type]
    salted = keyer.namespace_id(
        CacheIdentity(adapter_id=None, adapter_version=None, cache_salt="user-7", **base)  # type: ignore[arg-type]
    )
    lora = keyer.namespace_id(CacheIdentity(adapter_id="lora", adapter_version="1", **base))  # type: ignore[arg-type]
    tree = TenantRadixTree(1, pool.free)
    slots = fill(tree, pool, plain, [1, 2, 3])
    assert tree.match(plain, [1, 2, 3]).indices == tuple(slots)
    assert tree.match(salted, [1, 2, 3]).prefix_len == 0
    assert tree.match(lora, [1, 2, 3]).prefix_len == 0
    tree.check_integrity()


def _plant(parent: TreeNode, owner: str, key: tuple[int, ...], slots: list[int], page_size: int) -> TreeNode:
    """Corrupt the tree on purpose: hang a node owned by ``owner`` under ``parent``."""
    node = TreeNode(owner, key, slots, parent)
    parent.children[page_key(key, 0, page_size)] = node
    return node


def test_foreign_node_mid_path_fails_closed(pool: FakePool, page_size: int, caplog: pytest.LogCaptureFixture) -> None:
    tree = TenantRadixTree(page_size, pool.free)
    good = list(range(2 * page_size))
    slots = fill(tree, pool, A, good)
    leaf = next(iter(tree._private[A].children.values()))
    bad = [100 + i for i in range(page_size)]
    _plant(leaf, B, tuple(bad), [9000 + i for i in range(page_size)], page_size)
    with pytest.raises(AssertionError, match="owner"):
        tree.check_integrity()

    with caplog.at_level(logging.WARNING):
        res = tree.match(A, good + bad)
    assert res.indices == tuple(slots) and res.prefix_len == len(good)  # only the good prefix
    assert not set(res.indices) & set(range(9000, 9000 + page_size))
    assert tree.violations == 1 and tree.stats(A).violations == 1
    assert "isolation-violation" in caplog.text

    extra = pool.alloc(2 * page_size)
    ins = tree.insert(A, [*good, *bad, *range(200, 200 + page_size)], slots + extra)
    assert ins.prefix_len == len(good) and ins.inserted_len == 0  # nothing stored past the foreign node
    assert tree.violations == 2
    assert tree.match(A, good).indices == tuple(slots)  # positive control: good part still served


def test_foreign_node_at_root_gives_empty_match(pool: FakePool, page_size: int) -> None:
    tree = TenantRadixTree(page_size, pool.free)
    mine = fill(tree, pool, A, [7] * page_size)
    _plant(tree._private[A], B, tuple([5] * page_size), [9999] * page_size, page_size)
    res = tree.match(A, [5] * page_size)
    assert res.prefix_len == 0 and res.indices == () and tree.violations == 1
    assert tree.match(A, [7] * page_size).indices == tuple(mine)  # positive control
    assert tree.violations == 1
