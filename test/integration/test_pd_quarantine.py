"""The PD quarantine on real SGLang allocators (CPU): a page in transfer is never handed out again early.

Our scrubber and PdGuard wrap a real allocator as in a PD worker. Poisoned pages of a transfer are freed
while the transfer may still touch them: no allocation returns them (even after a pool clear) until the
transfer lets go, and then they come back scrubbed. Control: without the guard the same free hands the
poisoned pages straight out again (so these tests can fail).
"""

from __future__ import annotations

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

from sglang_iso.integration.pd_transfer import PdGuard
from sglang_iso.integration.scrub import KvScrubber

SIZE = 32
POISON = 5.0


def make(page_size: int, *, guard: bool = True) -> tuple[object, MHATokenToKVPool, PdGuard | None]:
    kv = MHATokenToKVPool(size=SIZE, page_size=page_size, dtype=torch.float32, head_num=1, head_dim=2, layer_num=1,
                          device="cpu", enable_memory_saver=False)  # fmt: skip
    if page_size == 1:
        allocator: object = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", kv, need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(SIZE, page_size, torch.float32, "cpu", kv, need_sort=False)
    KvScrubber(
        allocator, ReqToTokenPool(size=2, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    ).install()
    pd = PdGuard(allocator, b"k" * 32, "decode", 5.0).install() if guard else None
    return allocator, kv, pd


def drain_pool(allocator: object) -> list[int]:
    """Every slot the allocator will hand out now."""
    out: list[int] = []
    step = allocator.page_size  # type: ignore[attr-defined]
    while (slots := allocator.alloc(step)) is not None:  # type: ignore[attr-defined]
        out += slots.tolist()
    return out


@pytest.mark.parametrize("page_size", [1, 4])
def test_fenced_pages_are_held_until_the_transfer_lets_go(page_size: int) -> None:
    allocator, kv, pd = make(page_size)
    assert pd is not None
    slots = allocator.alloc(2 * page_size)  # type: ignore[attr-defined]
    kv.k_buffer[0][slots] = POISON
    pd.fence("acme.r1@7", slots)
    allocator.free(slots)  # type: ignore[attr-defined]  # the request ends while the engine may still write
    assert pd.held_tokens() == 2 * page_size
    allocator.clear()  # type: ignore[attr-defined]  # a flush / weight update clears the pool
    handed = drain_pool(allocator)
    assert not set(handed) & set(slots.tolist()), "a quarantined slot was handed out"
    assert bool(torch.all(kv.k_buffer[0][slots] == POISON))  # untouched: nobody was given it
    allocator.free(torch.tensor(handed, dtype=torch.int64))  # type: ignore[attr-defined]
    pd.failed("acme.r1@7", lambda: None)  # no drain seen
    pd.quarantine.clock = lambda: 1e12  # the drain timeout passes
    pd.tick()
    status = pd.quarantine.status()
    assert status["transfers_timed_out"] == 1 and status["quarantined_pages"] == 2
    assert not set(drain_pool(allocator)) & set(slots.tolist())  # still held after the timeout
    assert pd.reclaim() == 2  # operator: peer gone
    again = drain_pool(allocator)
    assert set(slots.tolist()) <= set(again)
    assert bool(torch.all(kv.k_buffer[0][slots] == 0))  # scrubbed before reuse


def test_success_releases_at_once() -> None:
    allocator, _kv, pd = make(1)
    assert pd is not None
    slots = allocator.alloc(3)  # type: ignore[attr-defined]
    pd.fence("k", slots)
    allocator.free(slots)  # type: ignore[attr-defined]
    assert not set(drain_pool(allocator)) & set(slots.tolist())
    pd.succeeded("k")
    assert pd.held_tokens() == 0


def test_control_without_the_guard_the_page_comes_straight_back() -> None:
    allocator, _kv, _ = make(1, guard=False)
    slots = allocator.alloc(2)  # type: ignore[attr-defined]
    allocator.free(slots)  # type: ignore[attr-defined]
    assert set(slots.tolist()) <= set(drain_pool(allocator))


def test_prefill_drain_predicate_is_sglangs() -> None:
    from types import SimpleNamespace

    from sglang.srt.disaggregation.base.conn import KVPoll

    from sglang_iso.integration.pd_transfer import prefill_room_idle

    def mgr(status: KVPoll | None, outstanding: int) -> SimpleNamespace:
        rooms = {} if status is None else {9: status}
        return SimpleNamespace(request_status=rooms, check_status=rooms.get, _staging_outstanding={9: outstanding})

    assert prefill_room_idle(mgr(KVPoll.Failed, 0), 9)  # aborted, nothing in flight: queued chunks are skipped
    assert prefill_room_idle(mgr(None, 0), 9)  # room already torn down
    assert not prefill_room_idle(mgr(KVPoll.Failed, 1), 9)  # a chunk is being written right now
    assert not prefill_room_idle(mgr(KVPoll.Transferring, 0), 9)  # not failed: chunks may still be read
