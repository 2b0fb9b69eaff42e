"""The owner check in SGLang's SWA sub-pool layout, on SGLang's own ``SWAKVPool`` and ``SWATokenToKVPoolAllocator``
(CPU), without a server.

Rows hold full-pool slots; the sliding layers read ``full_to_swa_index_mapping[slot]``. Each request adopts the
sliding-window pages it writes; a map entry its sliding layers can read that points at another owner's page (or a
FREE one, or nowhere) is pointed at the sub-pool's zero page, counted, and the request aborted. Columns SGLang already
freed out of the window (below the request's eviction cursor, or further back than the window) are not read and not
checked. The zero pages of both sub-pools survive every free path and a clear. Each refusal has its positive control:
the same reads of the owner's own pages pass.
"""

from __future__ import annotations

import weakref
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType

from sglang_iso.integration.owner_check import FREE, OwnerTable
from sglang_iso.integration.scrub import kv_buffers

SIZE, SIZE_SWA, WINDOW = 128, 64, 4


class _Req:
    """The attributes of an SGLang request the check reads: its row and its SWA eviction cursor."""

    def __init__(self, row: int) -> None:
        self.kv = SimpleNamespace(req_pool_idx=row, evicted=0, get_evicted_seqlen=self._cursor)
        self.to_finish = None

    def _cursor(self, component: Any) -> int:
        return int(self.kv.evicted) if component == ComponentType.SWA else 0


def _table(page_size: int) -> tuple[OwnerTable, Any, Any]:
    pool = SWAKVPool(
        size=SIZE, size_swa=SIZE_SWA, page_size=page_size, dtype=torch.float32, head_num=2, head_dim=8,
        swa_attention_layer_ids=[0, 2], full_attention_layer_ids=[1], device="cpu",
    )  # fmt: skip
    for sub in (pool.full_kv_pool, pool.swa_kv_pool):
        for buf in kv_buffers(sub):
            buf.fill_(7.0)  # poison: the zero pages must be zeroed by the table
    allocator = SWATokenToKVPoolAllocator(SIZE, SIZE_SWA, page_size, torch.float32, "cpu", pool, need_sort=False)
    rows = ReqToTokenPool(size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    cache = SimpleNamespace(
        token_to_kv_pool_allocator=allocator,
        req_to_token_pool=rows,
        device=torch.device("cpu"),
        swa_retain_window=WINDOW,
        readable_shared=lambda ns: [],
        namespace_of=lambda ns: SimpleNamespace(owner=ns),
    )
    return OwnerTable(cache).install(), allocator, pool


def _start(table: OwnerTable, allocator: Any, row: int, owner: str, n: int) -> tuple[_Req, torch.Tensor]:
    """A new request of ``owner`` in ``row`` with ``n`` new tokens (both sub-pools allocated, row written)."""
    ps = allocator.page_size
    if ps == 1:
        slots = allocator.alloc(n)
    else:
        zero, length = torch.tensor([0]), torch.tensor([n])
        slots = allocator.alloc_extend(zero, zero, length, length, torch.tensor([-1]), n)
    req = _Req(row)
    table.row_owner[row] = table.slot_of(owner)
    table._fill_allowed(int(table.row_owner[row]), owner)
    table._row_req[row] = weakref.ref(req)
    table.cache.req_to_token_pool.req_to_token[row, :n] = slots.to(torch.int32)
    return req, slots


def _batch(rows: list[int], seq_lens: list[int], starts: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
        extend_prefix_lens=torch.tensor(starts),
        extend_prefix_lens_cpu=starts,
        forward_mode=SimpleNamespace(is_extend=lambda: True, is_target_verify=lambda: False),
        spec_info=None,
    )


def _zero(sub: Any, page: int, page_size: int) -> bool:
    lo, hi = page * page_size, (page + 1) * page_size
    return all(int(torch.count_nonzero(buf[lo:hi])) == 0 for buf in kv_buffers(sub))


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_foreign_sliding_window_page_is_redirected_counted_and_aborted(page_size: int) -> None:
    table, allocator, pool = _table(page_size)
    swa = table.swa
    assert swa is not None and table.kv_allocator is allocator.full_attn_allocator
    assert _zero(pool.full_kv_pool, table.zero_page, page_size) and _zero(pool.swa_kv_pool, swa.zero_page, page_size)
    mapping = allocator.full_to_swa_index_mapping
    a, a_slots = _start(table, allocator, 1, "ns-a", 2 * page_size)
    b, b_slots = _start(table, allocator, 2, "ns-b", 2 * page_size)
    n = 2 * page_size
    table.check_batch(_batch([1, 2], [n, n], [0, 0]))
    me_a, me_b = table.slot_of("ns-a"), table.slot_of("ns-b")
    assert table.violations == 0 and swa.violations == 0  # positive control: own pages adopted and read
    assert set(swa.page_owner[mapping[a_slots] // page_size].tolist()) == {me_a}
    assert set(swa.page_owner[mapping[b_slots] // page_size].tolist()) == {me_b}

    own = int(mapping[a_slots[-1]])
    mapping[a_slots[-1]] = int(mapping[b_slots[0]])  # a's newest column now reads b's sliding-window page
    table.check_batch(_batch([1, 2], [n, n], [n, n]))  # (nothing new written: every column is an old one)
    assert swa.violations == 1 and table.violating_rows == {1}
    assert int(mapping[a_slots[-1]]) // page_size == swa.zero_page  # reads the sub-pool's zero page now
    assert int(mapping[b_slots[0]]) // page_size != swa.zero_page  # b untouched
    assert table.status()["owner_swa_violations"] == 1
    table.abort_violators(SimpleNamespace(reqs=[a, b]))
    assert a.to_finish is not None and "isolation violation" in str(a.to_finish.message) and b.to_finish is None
    assert _zero(pool.swa_kv_pool, swa.zero_page, page_size)
    mapping[a_slots[-1]] = own  # (its own page back: what a restore after a test plant does)
    table.check_batch(_batch([1], [n], [n]))
    assert swa.violations == 1  # positive control: its own page passes again


@pytest.mark.parametrize("page_size", [1, 4])
def test_columns_freed_out_of_the_window_are_not_checked_and_unmapped_ones_inside_are_refused(page_size: int) -> None:
    table, allocator, _ = _table(page_size)
    swa = table.swa
    assert swa is not None
    n = 4 * page_size + WINDOW
    req, slots = _start(table, allocator, 1, "ns-a", n)
    table.check_batch(_batch([1], [n], [0]))
    early = 2 * page_size  # SGLang frees a running request's early window, SWA side only, and moves its cursor
    allocator.free_swa_segment(slots[:early], start_pos=0)
    req.kv.evicted = early
    assert bool((allocator.full_to_swa_index_mapping[slots[:early]] == 0).all())
    table.check_batch(_batch([1], [n], [n - 1]))
    assert swa.violations == 0  # below its cursor: freed, not read, not checked
    req.kv.evicted = 0
    table.check_batch(_batch([1], [n], [n - 1]))
    assert swa.violations == 0  # further back than the window: not read
    allocator.full_to_swa_index_mapping[slots[n - 2]] = 0  # an unmapped entry inside the window
    table.check_batch(_batch([1], [n], [n - 1]))
    assert swa.violations == 1 and table.violating_rows == {1}


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_zero_pages_survive_the_release_of_a_refused_row_and_a_clear(page_size: int) -> None:
    table, allocator, pool = _table(page_size)
    swa = table.swa
    assert swa is not None
    n = 2 * page_size
    full_free, swa_free = allocator.full_available_size(), allocator.swa_available_size()
    _start(table, allocator, 1, "ns-a", n)
    _, b_slots = _start(table, allocator, 2, "ns-b", n)
    table.check_batch(_batch([1, 2], [n, n], [0, 0]))
    rtt = table.cache.req_to_token_pool.req_to_token
    rtt[1, 0] = int(b_slots[0])  # a's row reads b's full slot: the rows' check redirects it to the zero page
    table.check_batch(_batch([1], [n], [n]))
    assert table.violations >= 1 and int(rtt[1, 0]) // page_size == table.zero_page
    # The refused row is released whole (its zero-page slot with it), then b: nothing reserved is freed.
    allocator.free(rtt[1, :n].to(torch.int64))
    allocator.free(b_slots)
    # (a page-1 pool keeps a's refused slot and its peer: no row references them any more)
    assert full_free - page_size <= allocator.full_available_size() <= full_free
    assert swa_free - page_size <= allocator.swa_available_size() <= swa_free
    for sub, zero in ((allocator.full_attn_allocator, table.zero_page), (allocator.swa_attn_allocator, swa.zero_page)):
        assert zero not in sub.free_pages.tolist()  # neither zero page went back to its allocator
    zero_full = table.zero_page * page_size
    assert int(allocator.full_to_swa_index_mapping[zero_full]) // page_size == swa.zero_page  # still mapped
    assert int(table.page_owner[table.zero_page]) == table.zero_owner
    assert int(swa.page_owner[swa.zero_page]) == table.zero_owner
    allocator.clear()  # every page freed: fresh zero pages, zeroed and mapped
    assert int(table.page_owner[table.zero_page]) == table.zero_owner
    assert int(swa.page_owner[swa.zero_page]) == table.zero_owner
    assert (swa.page_owner == FREE).sum() == swa.page_owner.numel() - 1
    assert int(allocator.full_to_swa_index_mapping[table.zero_page * page_size]) // page_size == swa.zero_page
    assert _zero(pool.full_kv_pool, table.zero_page, page_size) and _zero(pool.swa_kv_pool, swa.zero_page, page_size)
