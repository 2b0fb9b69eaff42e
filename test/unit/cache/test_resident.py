"""The resident-slot bitmap against a plain set, and the tree's refusal of slots it cannot hold."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from fake_pool import FakePool
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_iso.cache import TenantRadixTree
from sglang_iso.cache.resident import MAX_SLOT, ResidentSlots

A = "t:a:m1"


def _arr(slots: list[int]) -> np.ndarray:
    return np.array(slots, dtype=np.int64)


def test_claim_holds_fresh_slots_and_refuses_held_or_repeated_ones_whole() -> None:
    res = ResidentSlots()
    assert res.claim(_arr([5, 6, 7])) and len(res) == 3 and 6 in res  # positive control
    assert not res.claim(_arr([8, 7]))  # 7 is held: 8 is not taken either
    assert 8 not in res and len(res) == 3
    assert not res.claim(_arr([9, 10, 9]))  # repeats within the claim
    assert not res.claim(_arr([12, 11, 12]))  # repeats, unordered
    assert res.held() == {5, 6, 7}
    assert res.claim(_arr([11, 9, 10]))  # unordered but distinct: taken
    res.release(_arr([6]))
    assert res.held() == {5, 7, 9, 10, 11} and len(res) == 5 and 6 not in res


def test_claim_grows_past_its_first_size_and_refuses_slots_out_of_range() -> None:
    res = ResidentSlots()
    assert res.claim(_arr([1_000_003]))
    assert 1_000_003 in res and 1_000_002 not in res and -1 not in res and 10**12 not in res
    for bad in ([-1], [MAX_SLOT + 1]):
        with pytest.raises(ValueError, match="slot ids"):
            res.claim(_arr(bad))
    assert res.held() == {1_000_003}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 300), max_size=12)), max_size=40))
def test_bitmap_equals_a_set_model(ops: list[tuple[bool, list[int]]]) -> None:
    res, model = ResidentSlots(), set[int]()
    claimed: list[list[int]] = []
    for release, slots in ops:
        if release and claimed:
            gone = claimed.pop(len(slots) % len(claimed))
            res.release(_arr(gone))
            model.difference_update(gone)
        else:
            ok = len(set(slots)) == len(slots) and model.isdisjoint(slots)
            assert res.claim(_arr(slots)) == ok
            if ok:
                model.update(slots)
                claimed.append(slots)
        assert res.held() == model and len(res) == len(model)
    res.release_all([_arr(c) for c in claimed])
    assert len(res) == 0 and not res.held()


def test_tree_refuses_slot_ids_out_of_range_before_changing_anything() -> None:
    pool = FakePool()
    tree = TenantRadixTree(1, pool.free)
    held = pool.alloc(2)
    tree.insert(A, [1, 2], held)
    for bad in ([-1, 3], [3, MAX_SLOT + 1], [3, 2**63 - 1], [3, 1.5]):
        with pytest.raises(ValueError, match="integers in 0"):
            tree.insert(A, [1, 2, 3, 4], [*held, *bad])
    assert tree.match(A, [1, 2, 3, 4]).indices == tuple(held)  # the cached prefix is intact
    assert tree.stats(A).resident == 2
    tree.check_integrity()


def test_free_fn_receives_the_evicted_nodes_slot_arrays() -> None:
    freed: list[array] = []
    tree = TenantRadixTree(1, freed.append)
    tree.insert(A, [1, 2, 3], array("q", [7, 8, 9]))
    tree.insert(A, [1, 2, 4], [7, 8, 10])
    assert tree.evict(10) == 4
    assert sorted(s for arr in freed for s in arr) == [7, 8, 9, 10]
    assert all(type(arr) is array and arr.typecode == "q" for arr in freed)
    assert len(tree._resident) == 0 and tree.match(A, [1, 2, 3]).prefix_len == 0
