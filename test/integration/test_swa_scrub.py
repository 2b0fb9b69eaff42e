"""Scrub-on-free for an SWA hybrid pool, on SGLang's own ``SWAKVPool`` and ``SWATokenToKVPoolAllocator`` (CPU).

The hybrid allocator keeps the full-attention layers' KV and the sliding-window layers' KV in two sub-pools with
an allocator each, joined by a full -> SWA slot map. Every path by which a slot of either sub-pool goes back to
its allocator must end in a zeroed slot before the slot is handed out again: a whole release (``free``: tree
eviction, request end), SGLang's out-of-window free of a running request's early SWA slots
(``free_swa_segment``, which never passes the tree) and grouped frees. Slots still in use keep their data
(poison written everywhere first). This is the pool-level part of the SWA sub-pool layout (served end to end in
``test/e2e/test_swa.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

from sglang_iso import coverage
from sglang_iso.coverage import NotCoveredError
from sglang_iso.integration.scrub import KvScrubber, SwaScrubber, kv_buffers, make_scrubber, unscrubbed_tensors

SIZE, SIZE_SWA = 64, 32
POISON = 7.0


def _build(page_size: int) -> tuple[Any, Any, Any]:
    pool = SWAKVPool(
        size=SIZE, size_swa=SIZE_SWA, page_size=page_size, dtype=torch.float32, head_num=2, head_dim=8,
        swa_attention_layer_ids=[0, 2], full_attention_layer_ids=[1], device="cpu",
    )  # fmt: skip
    allocator = SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, page_size, torch.float32, "cpu", pool, need_sort=False)
    rows = ReqToTokenPool(size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    return pool, allocator, rows


def _poison(pool: Any) -> None:
    for sub in (pool.full_kv_pool, pool.swa_kv_pool):
        for buf in kv_buffers(sub):
            buf.fill_(POISON)


def _rows_zero(sub: Any, slots: torch.Tensor) -> bool:
    return all(bool((buf[slots] == 0).all()) for buf in kv_buffers(sub))


def _rows_poisoned(sub: Any, slots: torch.Tensor) -> bool:
    return all(bool((buf[slots] == POISON).all()) for buf in kv_buffers(sub))


def _alloc(allocator: Any, n: int) -> torch.Tensor:
    """``n`` new slots of one new request (no prefix), as the scheduler asks for them at this page size."""
    if allocator.page_size == 1:
        slots = allocator.alloc(n)
    else:
        zero, length = torch.tensor([0]), torch.tensor([n])
        slots = allocator.alloc_extend(zero, zero, length, length, torch.tensor([-1]), n)
    assert slots is not None and slots.numel() == n
    return slots


@pytest.mark.parametrize("page_size", [1, 4])
def test_every_free_path_zeroes_its_sub_pool_and_live_slots_keep_their_data(page_size: int) -> None:
    pool, allocator, rows = _build(page_size)
    scrubber = make_scrubber(allocator, rows)
    assert isinstance(scrubber, SwaScrubber)
    assert unscrubbed_tensors(pool) == frozenset()
    mapping = allocator.full_to_swa_index_mapping

    released, out_of_window, grouped, live = (_alloc(allocator, 2 * page_size) for _ in range(4))
    _poison(pool)
    swa_of = {name: mapping[slots].clone() for name, slots in
              (("released", released), ("window", out_of_window), ("grouped", grouped), ("live", live))}  # fmt: skip
    assert all(bool((v > 0).all()) for v in swa_of.values())  # every full slot has its SWA peer

    allocator.free(released)  # tree eviction, request end: both sides
    allocator.free_swa_segment(out_of_window, start_pos=0)  # a running request's early window: SWA side only
    allocator.free_group_begin()
    allocator.free(grouped)
    allocator.free_group_end()
    # Positive control: released slots still hold the poison until the next hand-out (zeroing is batched there).
    assert _rows_poisoned(pool.full_kv_pool, released) and _rows_poisoned(pool.swa_kv_pool, swa_of["released"])

    _alloc(allocator, page_size)  # the next hand-out zeroes everything released before it
    for name in ("released", "grouped"):
        assert _rows_zero(pool.swa_kv_pool, swa_of[name]), name
    assert _rows_zero(pool.full_kv_pool, released) and _rows_zero(pool.full_kv_pool, grouped)
    assert _rows_zero(pool.swa_kv_pool, swa_of["window"])  # the out-of-window free, which bypasses the tree
    assert _rows_poisoned(pool.full_kv_pool, out_of_window)  # its full-attention KV is still the request's
    assert _rows_poisoned(pool.full_kv_pool, live) and _rows_poisoned(pool.swa_kv_pool, swa_of["live"])
    status = scrubber.status()
    assert status["swa_scrubbed_pages"] > 0 and status["scrubbed_pages"] > status["swa_scrubbed_pages"], status


def test_flush_zeroes_both_sides_at_once() -> None:
    pool, allocator, rows = _build(1)
    scrubber = make_scrubber(allocator, rows)
    slots = _alloc(allocator, 5)
    _poison(pool)
    swa = allocator.full_to_swa_index_mapping[slots].clone()
    allocator.free(slots)
    assert scrubber.flush() == 10  # five pages on each side
    assert _rows_zero(pool.full_kv_pool, slots) and _rows_zero(pool.swa_kv_pool, swa)
    assert scrubber.flush() == 0


def test_a_plain_pool_keeps_the_plain_scrubber() -> None:
    _, allocator, rows = _build(1)
    plain = make_scrubber(allocator.full_attn_allocator, rows)
    assert isinstance(plain, KvScrubber)


def test_what_the_swa_scrubber_would_miss_is_refused() -> None:
    pool, allocator, rows = _build(1)
    pool.swa_kv_pool.side_state = torch.zeros(SIZE_SWA, 4)  # a sub-pool tensor of an unknown kind
    assert unscrubbed_tensors(pool) == frozenset({"MHATokenToKVPool.side_state"})
    with pytest.raises(NotCoveredError, match="side_state"):
        make_scrubber(allocator, rows)
    del pool.swa_kv_pool.side_state
    pool.sink_cache = [torch.zeros(4)]  # a tensor on the hybrid pool itself
    assert unscrubbed_tensors(pool) == frozenset({"SWAKVPool.sink_cache"})
    del pool.sink_cache
    allocator._swa_req_ring = True  # SWA slots owned by request rows: released without the SWA allocator
    with pytest.raises(NotCoveredError, match="per-request SWA ring"):
        make_scrubber(allocator, rows)


def test_the_sub_pool_layout_is_served_with_the_owner_check_and_refused_on_torch_native_by_name() -> None:
    """Both sub-pools are covered by scrub and the owner check; SGLang's torch_native backend reads the sliding
    layers with untranslated ids, so that combination is refused by name (Triton is the control)."""
    pool, _, _ = _build(1)
    unscrubbed = unscrubbed_tensors(pool)
    assert unscrubbed == frozenset()

    def refused(backend: str) -> list[str]:
        features = coverage.Features(
            stage="scheduler", kv_pool_class=type(pool).__name__, hybrid_swa=True, unscrubbed_tensors=unscrubbed,
            kv_owner_check=True, attention_backends=frozenset({backend}),
        )  # fmt: skip
        return [r.feature for r in coverage.refusals(features)]

    assert refused("triton") == []
    assert any("torch_native" in feature for feature in refused("torch_native")), refused("torch_native")
