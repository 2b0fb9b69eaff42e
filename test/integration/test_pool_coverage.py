"""Every KV pool class of the model-family table, built small on CPU from SGLang's own classes.

Served pools: every tensor they hold is zeroed by scrub-on-free (poison, free, hand out again: all zero;
slots never freed keep the poison). DSA's pool adds page-indexed index keys (row p of page p) and
request-indexed compress tails, each zeroed on its own free path. A pool class SGLang might add (a subclass
with one more tensor, or an index-key cache of another layout) is refused by the coverage table, naming the
class and the tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache import memory_pool
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

from sglang_iso import coverage
from sglang_iso.integration.scrub import KvScrubber, kv_buffers, pool_tensors, uncovered_tensors

SIZE = 64
LAYERS = 2


def _mha(cls: type) -> Any:
    return cls(SIZE, 1, torch.float32, 2, 32, LAYERS, "cpu", False)


def _mla(cls: type) -> Any:
    return cls(SIZE, 1, torch.float32, 64, 16, LAYERS, "cpu", False)


def _linear_hybrid(cls: type) -> Any:
    """Attention layers 0 and 1 in an MHA pool beside a (tiny) recurrent-state pool, as a GDN hybrid's."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=4, head_dim=8, state_size=4, conv_kernel=4
    )
    rows = memory_pool.HybridReqToTokenPool(
        size=4, mamba_size=4, mamba_spec_state_size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=shape, layers=[2]), mamba_layer_ids=[2],
        enable_mamba_extra_buffer=False, enable_overlap_schedule=False,
    )  # fmt: skip
    return cls(size=SIZE, dtype=torch.float32, page_size=1, head_num=2, head_dim=32,
               full_attention_layer_ids=list(range(LAYERS)), device="cpu", mamba_pool=rows.mamba_pool)  # fmt: skip


BUILDERS: dict[str, Callable[[type], Any]] = {
    "HybridLinearKVPool": _linear_hybrid,
    "MHATokenToKVPool": _mha,
    "MHATokenToKVPoolFP4": _mha,
    "MHATokenToKVPoolMXFP8": _mha,
    "MLATokenToKVPool": _mla,
    "MLATokenToKVPoolFP4": _mla,
}


DSA_LAYOUTS = {
    # name: (page size, index_kpool, compress tails, skip-topk layers)
    "one index page per page": (64, 1, False, None),
    "pooled index keys with compress tails": (128, 2, True, None),
    "a layer sharing the previous top-k": (64, 1, False, [False, True]),
}
DSA_ROWS = 4  # max running requests: req_to_token and the tails have DSA_ROWS + 1 rows


def _dsa_pool(layout: str = "one index page per page") -> Any:
    page_size, kpool, compress, skip = DSA_LAYOUTS[layout]
    return memory_pool.DSATokenToKVPool(
        size=4 * page_size, page_size=page_size, kv_lora_rank=64, dtype=torch.bfloat16, qk_rope_head_dim=16,
        layer_num=LAYERS, device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=80,
        index_buf_size=4 * page_size, index_kpool=kpool, index_kpool_compress=compress,
        max_running_requests=DSA_ROWS, skip_topk_layers=skip,
    )  # fmt: skip


def _refusals(pool: Any) -> list[coverage.Refusal]:
    features = coverage.Features(
        stage="scheduler", kv_pool_class=type(pool).__name__, unscrubbed_tensors=uncovered_tensors(pool)
    )
    return coverage.refusals(features)


def test_every_served_pool_class_has_a_builder_here() -> None:
    # DSA: its own test below; SWA sub-pools: test_swa_scrub.py (one scrubber per sub-pool)
    assert {*BUILDERS, "DSATokenToKVPool", "SWAKVPool"} == set(coverage.COVERED_POOLS)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_served_pool_is_zeroed_on_every_tensor(name: str) -> None:
    pool = BUILDERS[name](getattr(memory_pool, name))
    assert uncovered_tensors(pool) == frozenset()
    assert _refusals(pool) == []
    buffers = kv_buffers(pool)
    scale_attrs = [a for a in ("k_scale_buffer", "v_scale_buffer", "kv_scale_buffer") if getattr(pool, a, None)]
    assert len(buffers) == LAYERS * (len(scale_attrs) + (1 if hasattr(pool, "kv_buffer") else 2))
    allocator = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", pool, need_sort=False)
    req_pool = ReqToTokenPool(size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    scrubber = KvScrubber(allocator, req_pool).install()
    freed, kept = allocator.alloc(8), allocator.alloc(8)
    for buf in buffers:
        buf.view(torch.uint8)[torch.cat([freed, kept]).long()] = 0x5A  # poison, byte-wise (any dtype)
    allocator.free(freed)
    handed_out = allocator.alloc(allocator.available_size())
    assert set(freed.tolist()) <= set(handed_out.tolist())
    assert scrubber.scrubbed_pages >= freed.numel()
    for buf in buffers:
        assert int(torch.count_nonzero(buf.view(torch.uint8)[freed.long()])) == 0, (name, buf.shape)
        assert bool(torch.all(buf.view(torch.uint8)[kept.long()] == 0x5A)), (name, buf.shape)  # control


@pytest.mark.parametrize("layout", sorted(DSA_LAYOUTS))
def test_dsa_pool_zeroes_index_keys_by_page_and_tails_by_request(layout: str) -> None:
    pool = _dsa_pool(layout)
    assert uncovered_tensors(pool) == frozenset()
    assert _refusals(pool) == []
    tensors = pool_tensors(pool)
    assert len(tensors.pages) == LAYERS - sum(DSA_LAYOUTS[layout][3] or [])  # empty shared-top-k layers left out
    assert len(tensors.requests) == (2 * LAYERS if DSA_LAYOUTS[layout][2] else 0)
    page_size = pool.page_size
    allocator = PagedTokenToKVPoolAllocator(pool.size, page_size, torch.bfloat16, "cpu", pool, need_sort=False)
    req_pool = ReqToTokenPool(size=DSA_ROWS, max_context_len=pool.size, device="cpu", enable_memory_saver=False)
    scrubber = KvScrubber(allocator, req_pool).install()
    freed, kept = allocator.alloc(page_size), allocator.alloc(page_size)
    freed_page, kept_page = int(freed[0]) // page_size, int(kept[0]) // page_size
    rows = req_pool.alloc_rows(2)
    assert rows is not None
    for buf in tensors.slots:
        buf.view(torch.uint8)[torch.cat([freed, kept]).long()] = 0x5A
    for buf in tensors.pages:
        buf[[freed_page, kept_page]] = 0x5A
    for buf in tensors.requests:
        buf.view(torch.uint8)[rows] = 0x5A

    allocator.free(freed)
    req_pool.free_rows([rows[0]])
    handed_out = allocator.alloc(allocator.available_size())
    assert set(freed.tolist()) <= set(handed_out.tolist())
    assert scrubber.scrubbed_pages >= 1
    for buf in tensors.slots:
        assert int(torch.count_nonzero(buf.view(torch.uint8)[freed.long()])) == 0, buf.shape
        assert bool(torch.all(buf.view(torch.uint8)[kept.long()] == 0x5A)), buf.shape  # control
    for buf in tensors.pages:
        assert int(torch.count_nonzero(buf[freed_page])) == 0, buf.shape
        assert bool(torch.all(buf[kept_page] == 0x5A)), buf.shape  # control: a live page keeps its keys
    for buf in tensors.requests:
        assert int(torch.count_nonzero(buf.view(torch.uint8)[rows[0]])) == 0, buf.shape
        assert bool(torch.all(buf.view(torch.uint8)[rows[1]] == 0x5A)), buf.shape  # control: a live request


def test_an_index_key_cache_of_another_layout_fails_closed() -> None:
    """An index-key cache keeping another tensor, or split by decode context parallelism, is not the known
    page-row layout: the pool is refused naming ``index_key_cache``."""
    extra = _dsa_pool()
    extra.index_key_cache.scales = torch.zeros(8, 4)
    split = _dsa_pool()
    split.index_page_size //= 2
    for pool in (extra, split):
        message = coverage.explain(_refusals(pool))
        assert "DSATokenToKVPool.index_key_cache" in message, message
        assert pool_tensors(pool).pages == []
    assert _refusals(_dsa_pool()) == []  # control: the layout SGLang builds is served


def test_dsa_request_tails_shorter_than_the_row_table_are_refused() -> None:
    pool = _dsa_pool("pooled index keys with compress tails")
    allocator = PagedTokenToKVPoolAllocator(pool.size, pool.page_size, torch.bfloat16, "cpu", pool, need_sort=False)
    big = ReqToTokenPool(size=DSA_ROWS * 2, max_context_len=pool.size, device="cpu", enable_memory_saver=False)
    with pytest.raises(coverage.NotCoveredError, match="req_to_token"):
        KvScrubber(allocator, big)
    same = ReqToTokenPool(size=DSA_ROWS, max_context_len=pool.size, device="cpu", enable_memory_saver=False)
    assert KvScrubber(allocator, same).tensors.requests  # control


def test_a_new_pool_class_with_one_more_tensor_fails_closed() -> None:
    class MLATokenToKVPoolWithTail(memory_pool.MLATokenToKVPool):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.tail = torch.zeros(SIZE + 1, 8)

    pool = _mla(MLATokenToKVPoolWithTail)
    message = coverage.explain(_refusals(pool))
    assert "MLATokenToKVPoolWithTail (not in the model-family table)" in message, message
    assert "MLATokenToKVPoolWithTail.tail" in message, message
    assert _refusals(_mla(memory_pool.MLATokenToKVPool)) == []  # control: the class it extends is served
