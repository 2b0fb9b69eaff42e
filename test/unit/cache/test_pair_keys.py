"""Packed token-pair keys (the tree's key with an EAGLE-style draft head)."""

from __future__ import annotations

from array import array

import pytest
from fake_pool import FakePool
from hypothesis import given
from hypothesis import strategies as st

from sglang_iso.cache import TenantRadixTree
from sglang_iso.cache.pair_keys import MAX_TOKEN, pair_key, unpack_pairs

TOKENS = st.lists(st.integers(0, MAX_TOKEN - 1), max_size=40)


@given(TOKENS)
def test_pairs_round_trip_and_cover_one_position_less(tokens: list[int]) -> None:
    key = pair_key(tokens)
    assert len(key) == max(0, len(tokens) - 1)
    assert unpack_pairs(key) == (tokens if len(tokens) > 1 else [])
    assert pair_key(array("q", tokens)) == key  # the scheduler's array form packs the same


@given(TOKENS, TOKENS)
def test_a_shared_key_prefix_means_the_next_token_agrees_too(a: list[int], b: list[int]) -> None:
    ka, kb = pair_key(a), pair_key(b)
    common = 0
    while common < min(len(ka), len(kb)) and ka[common] == kb[common]:
        common += 1
    agree = 0
    while agree < min(len(a), len(b)) and a[agree] == b[agree]:
        agree += 1
    assert common == max(0, agree - 1)  # entry i is shared only when tokens i and i + 1 both agree


@pytest.mark.parametrize("bad", [[1, -1], [MAX_TOKEN, 2], [2, 1 << 40], [[1, 2], [3, 4]], ["a", "b"]])
def test_unpackable_tokens_are_refused(bad: list) -> None:
    with pytest.raises(ValueError, match="tokens must be"):
        pair_key(bad)


def test_tree_keyed_by_pairs_stops_before_a_differing_next_token(pool: FakePool) -> None:
    tree = TenantRadixTree(1, pool.free)
    a, b = [5, 6, 7, 8, 9], [5, 6, 7, 8, 10]
    slots = pool.alloc(len(a) - 1)
    assert tree.insert("ns-a", pair_key(a), slots).stored_len == 4  # the last token's slot is not cached
    assert tree.match("ns-a", pair_key(a)).prefix_len == 4  # positive control: the same tokens hit
    # b agrees on 4 tokens, but position 3's draft KV was made with token 9 next, so only 3 positions reuse
    assert list(tree.match("ns-a", pair_key(b)).indices) == slots[:3]
    assert tree.match("ns-b", pair_key(a)).prefix_len == 0  # and namespaces stay apart
    tree.check_integrity()


def test_shared_prefix_declared_by_pairs_is_read_by_its_readers_only(pool: FakePool) -> None:
    tree = TenantRadixTree(1, pool.free)
    for ns, tenant in (("ns-a", "a"), ("ns-b", "b"), ("ns-c", "c")):
        tree.register_namespace(ns, tenant_id=tenant, scope="s")
    system = [1000 + i for i in range(9)]
    tree.declare_shared("sys", pair_key(system), frozenset({"a", "b"}), scope="s")  # 8 entries
    first = [*system, 5, 6]
    slots = pool.alloc(len(first) - 1)
    assert tree.insert("ns-a", pair_key(first), slots).stored_len == 10
    got = tree.match("ns-b", pair_key([*system, 7, 8]))  # a reader with its own continuation
    assert list(got.indices) == slots[:8]  # the shared pairs only: (1008, 7) is b's own, not cached
    assert tree.match("ns-a", pair_key(first)).prefix_len == 10  # positive control: a's continuation
    assert tree.match("ns-c", pair_key(first)).prefix_len == 0  # not a reader
    tree.check_integrity()
