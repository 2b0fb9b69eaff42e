"""The representation choices behind the tree's speed keep every check: key types, slot types, resident slots,
incremental evictable-leaf sets, slice-based prefix matching."""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable, Sequence

import pytest
from fake_pool import FakePool

from sglang_iso.cache import TenantRadixTree
from sglang_iso.cache.node import common_prefix_len

A, B = "t:a:m1", "t:b:m1"


def _naive_common(key: list[int], tokens: list[int], start: int, page: int) -> int:
    n = 0
    while n < min(len(key), len(tokens) - start) and key[n] == tokens[start + n]:
        n += 1
    return n - n % page


@pytest.mark.parametrize("seed", range(20))
def test_common_prefix_len_equals_token_by_token(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        page = rng.choice([1, 4, 16])
        key = [rng.randrange(3) for _ in range(rng.randrange(1, 200))]
        tokens = [rng.randrange(50)] * rng.randrange(5) + key[: rng.randrange(len(key) + 1)]
        tokens += [rng.randrange(3) for _ in range(rng.randrange(20))]
        start = rng.randrange(len(tokens) + 1)
        got = common_prefix_len(array("q", key), array("q", tokens), start, page)
        assert got == _naive_common(key, tokens, start, page), f"{key=} {tokens=} {start=} {page=}"


@pytest.mark.parametrize("kind", [list, tuple, lambda t: array("q", t), lambda t: array("l", t)])
def test_token_container_types_are_interchangeable(
    tree: TenantRadixTree, pool: FakePool, page_size: int, kind: Callable[[list[int]], Sequence[int]]
) -> None:
    tokens = list(range(1, 3 * page_size + 1))
    slots = pool.alloc(len(tokens))
    assert tree.insert(A, list(tokens), slots).inserted_len == len(tokens)
    hit = tree.match(A, kind(tokens))
    assert hit.indices == tuple(slots) and type(hit.indices) is tuple
    again = tree.insert(A, kind(tokens), slots)
    assert (again.prefix_len, again.inserted_len, again.duplicate_indices) == (len(tokens), 0, ())


def test_caller_array_is_not_aliased(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    tokens = array("q", range(1, 2 * page_size + 1))
    slots = pool.alloc(len(tokens))
    tree.insert(A, tokens, slots)
    original = list(tokens)
    for i in range(len(tokens)):
        tokens[i] = -1
    assert tree.match(A, original).indices == tuple(slots)
    assert tree.match(A, tokens).prefix_len == 0


def test_non_int_tokens_and_slots_are_rejected(tree: TenantRadixTree, page_size: int) -> None:
    with pytest.raises(ValueError, match="tokens"):
        tree.match(A, ["x"] * page_size)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="tokens"):
        tree.insert(A, [2**70] * page_size, list(range(page_size)))
    with pytest.raises(ValueError, match="indices"):
        tree.insert(A, list(range(page_size)), [0.5] * page_size)  # type: ignore[list-item]
    assert tree.total_size() == 0


class _OddHashInt(int):
    """An int whose hash is not an int's: stored unconverted it would slip past the resident-slot set."""

    def __hash__(self) -> int:
        return -12345


def test_int_like_slots_are_stored_as_exact_ints(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    held = pool.alloc(page_size)
    tree.insert(A, [1] * page_size, [_OddHashInt(s) for s in held])
    stored = tree.match(A, [1] * page_size).indices
    assert stored == tuple(held) and all(type(s) is int for s in stored)
    # The same slots again, under another namespace: refused although the caller's objects hash differently.
    res = tree.insert(B, [2] * page_size, [_OddHashInt(s) for s in held])
    assert res.inserted_len == 0 and tree.violations == 1


def test_refused_insert_keeps_resident_slots_exact(tree: TenantRadixTree, pool: FakePool, page_size: int) -> None:
    held = pool.alloc(page_size)
    tree.insert(A, [1] * page_size, held)
    fresh = pool.alloc(2 * page_size)
    # New slots that repeat one another, then new slots that include a held one: both refused, nothing leaks.
    dup = tree.insert(A, [2] * (2 * page_size), [fresh[0]] * (2 * page_size))
    clash = tree.insert(B, [3] * (2 * page_size), [*fresh[:page_size], *held])
    assert dup.inserted_len == 0 and clash.inserted_len == 0 and tree.violations == 2
    assert tree._resident.held() == set(held)
    tree.check_integrity()
    # The refused fresh slots are still the caller's to use.
    assert tree.insert(B, [3] * (2 * page_size), fresh).inserted_len == 2 * page_size


def test_evictable_leaf_sets_follow_every_mutation(pool: FakePool, page_size: int) -> None:
    """Random inserts, matches, locks and evictions over several namespaces; the integrity check compares the
    incrementally kept leaf sets with a full recount after every step."""
    rng = random.Random(7)
    tree = TenantRadixTree(page_size, pool.free)
    tree.set_quota(B, 40 * page_size)
    locked = []
    for _ in range(400):
        ns = rng.choice([A, B, "t:c:m1"])
        tokens = [rng.randrange(3) for _ in range(page_size * rng.randrange(0, 12))]
        roll = rng.random()
        if roll < 0.5:
            hit = tree.match(ns, tokens)
            tree.insert(ns, tokens, [*hit.indices, *pool.alloc(len(tokens) - hit.prefix_len)])
        elif roll < 0.65:
            handle = tree.match(ns, tokens).last_node
            tree.inc_lock(handle)
            locked.append(handle)
        elif roll < 0.8 and locked:
            tree.dec_lock(locked.pop(rng.randrange(len(locked))))
        elif roll < 0.9:
            tree.evict(rng.randrange(0, 30 * page_size))
        else:
            tree.flush(ns)
        tree.check_integrity()
    for handle in locked:
        tree.dec_lock(handle)
    tree.evict(tree.total_size())
    tree.check_integrity()
    assert tree.total_size() == 0 and not pool.live
