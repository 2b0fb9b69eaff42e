"""Differential test: ``TenantRadixTree`` against upstream SGLang's ``RadixCache`` on the same random traces.

One namespace of ours must behave like upstream's tree: same match lengths and slots, same insert prefix
lengths, same total / evictable / protected sizes after every op, same tokens (and slots) freed by every
evict call. Several namespaces must behave like upstream with one ``extra_key`` per namespace.

Two things make eviction comparable op by op:

* Ties. Upstream stamps nodes with ``time.monotonic()``; two leaves with equal stamps would be evicted in
  set-iteration order. The ``upstream_clock`` fixture swaps the ``time`` module seen by upstream's
  ``radix_cache`` for a counter, so every stamp is distinct and upstream's LRU order is deterministic.
  Ours uses a logical clock already; in both trees the nodes sharing a stamp lie on one root-to-leaf path,
  so at most one of them is ever an evictable leaf (no ties left).
* One real difference in the LRU rule (see ``test_split_tail_recency_differs_from_upstream``): when a
  match or insert ends inside a node, upstream stamps the whole node *before* splitting it, so the
  unmatched tail counts as just used; ours stamps only what the request actually walked. Strict traces
  therefore run ours through ``_UpstreamTouchTree``, which copies upstream's rule and nothing else; the
  trace on the unmodified tree compares evictions only through evict-everything calls, whose outcome
  does not depend on order.
"""

from __future__ import annotations

import itertools
import random
import time
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache import radix_cache
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from sglang_iso.cache import NodeHandle, TenantRadixTree
from sglang_iso.cache.node import TreeNode
from sglang_iso.cache.pair_keys import pair_key

SEEDS = range(12)
PAGE_SIZES = (1, 4)
STEPS = 250


class _LogicalClock:
    """Replaces the ``time`` module inside upstream's ``radix_cache``: each ``monotonic()`` is a new, larger value."""

    def __init__(self) -> None:
        self._ticks = itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self._ticks))

    @staticmethod
    def perf_counter() -> float:
        return time.perf_counter()


@pytest.fixture
def upstream_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(radix_cache, "time", _LogicalClock())


class _RecordingAllocator:
    """The only allocator method upstream's simulated tree calls: ``free_segment`` on eviction."""

    device = "cpu"

    def __init__(self) -> None:
        self.freed: list[int] = []
        """Slots passed to ``free_segment`` since the last ``take``."""

    def free_segment(self, indices: torch.Tensor, start_pos: int = 0) -> None:
        self.freed.extend(indices.tolist())

    def take(self) -> list[int]:
        out, self.freed = self.freed, []
        return out


class _UpstreamTouchTree(TenantRadixTree):
    """Our tree with upstream's split-recency rule: the tail of a split node counts as accessed now.

    Upstream orders the stamps ``path == tail < upper half < new leaf``; the clock bump after the split
    reproduces that order (the upper half and a new leaf of this op get the bumped value).
    """

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        upper = super()._split(child, n)
        child.last_access = self._clock
        self._clock += 1
        return upper


class _Differential:
    """Applies each op to our tree and to upstream's ``RadixCache`` and asserts they agree."""

    def __init__(self, tree_cls: type[TenantRadixTree], page_size: int, *, pairs: bool = False) -> None:
        self.page_size = page_size
        self.pairs = pairs
        """Keyed by token pairs (ours: ``pair_key``; upstream: its EAGLE bigram view)."""
        self.ours_freed: list[int] = []
        """Slots our tree passed to ``free_fn`` since the last ``evict``."""
        self.ours = tree_cls(page_size, self.ours_freed.extend)
        self.alloc = _RecordingAllocator()
        self.up = RadixCache.create_simulated(mock_allocator=self.alloc, page_size=page_size)
        self.up.is_eagle = pairs
        self.locks: list[tuple[NodeHandle, Any]] = []
        """Outstanding locks: (our handle, upstream node), taken on the same match."""
        self._slots = itertools.count(10_000)

    def _key(self, tokens: list[int]) -> Sequence[int]:
        return pair_key(tokens) if self.pairs else tokens

    def _up_key(self, tokens: list[int], ns: str) -> RadixKey:
        return RadixKey(array("q", tokens), extra_key=ns)

    def match(self, ns: str, tokens: list[int]) -> tuple[NodeHandle, Any]:
        mine = self.ours.match(ns, self._key(tokens))
        theirs = self.up.match_prefix(MatchPrefixParams(key=self._up_key(tokens, ns)))
        assert mine.prefix_len == theirs.device_prefix_len, f"{ns=} {tokens=} {mine.prefix_len=} {theirs=}"
        up_slots = self.up.path_device_indices(theirs.last_device_node).tolist()
        assert list(mine.indices) == up_slots, f"{tokens=} {mine.indices=} {up_slots=}"
        return mine.last_node, theirs.last_device_node

    def insert(self, ns: str, tokens: list[int], *, reuse_match: bool) -> None:
        """Insert like the scheduler does (matched slots, then fresh ones), or with all-fresh slots."""
        key = self._key(tokens)
        matched = self.ours.match(ns, key).indices
        self.up.match_prefix(MatchPrefixParams(key=self._up_key(tokens, ns)))  # the same LRU touches
        prefix = matched if reuse_match else ()
        slots = [*prefix, *(next(self._slots) for _ in range(len(tokens) - len(prefix)))]
        mine = self.ours.insert(ns, key, slots[: len(key)])
        value = torch.tensor(slots, dtype=torch.int64)  # one slot per raw token: upstream cuts it to its key
        theirs = self.up.insert(InsertParams(key=self._up_key(tokens, ns), value=value))
        assert mine.prefix_len == theirs.prefix_len, f"{tokens=} {mine=} {theirs.prefix_len=}"
        aligned = len(key) - len(key) % self.page_size
        assert mine.stored_len == aligned, f"{mine=} {aligned=}"
        cached = self.up.path_device_indices(theirs.last_device_node).tolist()
        expected_dups = tuple(s for s, c in zip(slots[: mine.prefix_len], cached, strict=False) if s != c)
        assert mine.duplicate_indices == expected_dups, f"{mine.duplicate_indices=} {expected_dups=}"

    def lock(self, ns: str, tokens: list[int]) -> None:
        handle, node = self.match(ns, tokens)
        self.ours.inc_lock(handle)
        self.up.inc_lock_ref(node)
        self.locks.append((handle, node))

    def unlock(self, which: int) -> None:
        handle, node = self.locks.pop(which)
        self.ours.dec_lock(handle)
        self.up.dec_lock_ref(node)

    def evict(self, num_tokens: int) -> None:
        self.ours_freed.clear()
        mine = self.ours.evict(num_tokens)
        theirs = self.up.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted
        up_freed = self.alloc.take()
        assert mine == theirs, f"{num_tokens=} evicted {mine=} {theirs=}"
        assert sorted(self.ours_freed) == sorted(up_freed), f"{num_tokens=} {self.ours_freed=} {up_freed=}"

    def check(self) -> None:
        self.ours.check_integrity()
        ours = (self.ours.total_size(), self.ours.evictable_size(), self.ours.protected_size())
        theirs = (self.up.total_size(), self.up.evictable_size(), self.up.protected_size())
        assert ours == theirs, f"(total, evictable, protected): {ours=} {theirs=}"


def _sequences(rng: random.Random, n_prompts: int) -> Iterator[list[int]]:
    """Requests that share prefixes: a "system prompt" + a short branchy middle + a random tail.

    Lengths are often not page-aligned; some requests are a cut or an extension of an earlier one, so
    matches end inside nodes and splits happen.
    """
    prompts = [[rng.randrange(1, 60) for _ in range(rng.randrange(0, 24))] for _ in range(n_prompts)]
    seen: list[list[int]] = []
    while True:
        roll = rng.random()
        if seen and roll < 0.2:
            old = rng.choice(seen)
            seq = old[: rng.randrange(0, len(old) + 1)]
        elif seen and roll < 0.3:
            seq = rng.choice(seen) + [rng.randrange(1, 8) for _ in range(rng.randrange(1, 9))]
        else:
            middle = [rng.randrange(1, 4) for _ in range(rng.randrange(0, 6))]
            seq = rng.choice(prompts) + middle + [rng.randrange(1, 60) for _ in range(rng.randrange(0, 12))]
        seen.append(seq)
        yield seq


def _run_trace(diff: _Differential, seed: int, namespaces: list[str], *, partial_evicts: bool) -> None:
    """``partial_evicts=False``: every evict asks for at least everything evictable (order-independent)."""
    rng = random.Random(seed)
    seqs = _sequences(rng, n_prompts=4)
    for _ in range(STEPS):
        ns = rng.choice(namespaces)
        roll = rng.random()
        if roll < 0.35:
            diff.insert(ns, next(seqs), reuse_match=rng.random() < 0.8)
        elif roll < 0.55:
            diff.match(ns, next(seqs))
        elif roll < 0.7:
            diff.lock(ns, next(seqs))
        elif roll < 0.82 and diff.locks:
            diff.unlock(rng.randrange(len(diff.locks)))
        elif partial_evicts:
            diff.evict(rng.randrange(0, 40))
        elif rng.random() < 0.3:
            diff.evict(diff.ours.evictable_size() + rng.randrange(0, 3))
        diff.check()
    while diff.locks:
        diff.unlock(len(diff.locks) - 1)
        diff.check()
    diff.evict(diff.ours.total_size() + 1)
    diff.check()
    assert diff.ours.total_size() == diff.up.total_size() == 0


@pytest.mark.usefixtures("upstream_clock")
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_single_namespace_matches_upstream_op_by_op(seed: int, page_size: int) -> None:
    """Everything equal after every op, partial evictions included (with upstream's split-recency rule)."""
    _run_trace(_Differential(_UpstreamTouchTree, page_size), seed, ["t:acme:m1"], partial_evicts=True)


@pytest.mark.usefixtures("upstream_clock")
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("seed", SEEDS)
def test_unmodified_tree_matches_upstream_with_order_free_evictions(seed: int, page_size: int) -> None:
    """The shipped tree, unpatched: matches, inserts, locks and sizes equal; evictions evict everything."""
    _run_trace(_Differential(TenantRadixTree, page_size), seed, ["t:acme:m1"], partial_evicts=False)


@pytest.mark.usefixtures("upstream_clock")
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("seed", SEEDS[:6])
def test_namespaces_behave_like_upstream_extra_keys(seed: int, page_size: int) -> None:
    """Three namespaces of ours == upstream with one ``extra_key`` each (global LRU, no quotas)."""
    namespaces = ["t:acme:m1", "t:globex:m1", "t:initech:m1"]
    _run_trace(_Differential(_UpstreamTouchTree, page_size), seed, namespaces, partial_evicts=True)


@pytest.mark.usefixtures("upstream_clock")
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("seed", SEEDS[:6])
def test_pair_keys_match_upstream_eagle_bigram_keys(seed: int, page_size: int) -> None:
    """With an EAGLE-style draft head: ours keyed by ``pair_key`` == upstream's bigram view, op by op."""
    namespaces = ["t:acme:m1", "t:globex:m1"]
    _run_trace(_Differential(_UpstreamTouchTree, page_size, pairs=True), seed, namespaces, partial_evicts=True)


@pytest.mark.usefixtures("upstream_clock")
def test_split_tail_recency_differs_from_upstream() -> None:
    """Documented difference: a match ending inside a node refreshes the node's tail upstream, not in ours.

    Trace: insert A=[1,2,3,4], insert B=[9], match [1,2] (splits A into [1,2] + [3,4]), evict 1 token.
    Upstream stamped all of A before splitting it, so [3,4] is newer than B and B goes. Ours never read
    [3,4] since A's insert, so [3,4] is the least recently used leaf and goes.
    """
    freed: list[int] = []
    ours = TenantRadixTree(1, freed.extend)
    alloc = _RecordingAllocator()
    up = RadixCache.create_simulated(mock_allocator=alloc, page_size=1)
    for tokens, slots in (([1, 2, 3, 4], [11, 12, 13, 14]), ([9], [19])):
        ours.insert("t:acme:m1", tokens, slots)
        up.insert(InsertParams(key=RadixKey(tokens), value=torch.tensor(slots, dtype=torch.int64)))
    assert ours.match("t:acme:m1", [1, 2]).prefix_len == 2
    assert up.match_prefix(MatchPrefixParams(key=RadixKey([1, 2]))).device_prefix_len == 2

    assert ours.evict(1) == 2 and freed == [13, 14]
    assert up.evict(EvictParams(num_tokens=1)).num_tokens_evicted == 1 and alloc.take() == [19]


def test_two_namespaces_do_not_share_what_upstream_shares() -> None:
    """Documented contrast: the same tokens in two namespaces are stored twice by us, once upstream.

    Upstream shares every entry among requests with the same ``extra_key`` (None here, its default), so
    tenant B is served tenant A's KV. Ours keys the tree by namespace: B misses and stores its own copy.
    """
    tokens = list(range(1, 33))
    a_slots, b_slots = list(range(100, 132)), list(range(200, 232))

    freed: list[int] = []
    ours = TenantRadixTree(4, freed.extend)
    assert ours.insert("t:a:m1", tokens, a_slots).inserted_len == 32
    assert ours.match("t:b:m1", tokens).prefix_len == 0
    b_insert = ours.insert("t:b:m1", tokens, b_slots)
    assert (b_insert.prefix_len, b_insert.inserted_len) == (0, 32)
    assert ours.total_size() == 64
    assert ours.match("t:b:m1", tokens).indices == tuple(b_slots)
    ours.check_integrity()

    up = RadixCache.create_simulated(mock_allocator=_RecordingAllocator(), page_size=4)
    up.insert(InsertParams(key=RadixKey(tokens), value=torch.tensor(a_slots, dtype=torch.int64)))
    hit = up.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
    assert hit.device_prefix_len == 32
    assert up.path_device_indices(hit.last_device_node).tolist() == a_slots  # B would read A's KV
    b_up = up.insert(InsertParams(key=RadixKey(tokens), value=torch.tensor(b_slots, dtype=torch.int64)))
    assert b_up.prefix_len == 32
    assert up.total_size() == 32
