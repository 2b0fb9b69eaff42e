"""Every KV pool class of the model-family table, built small on CPU from SGLang's own classes.

Served pools: every tensor they hold is zeroed by scrub-on-free (poison, free, hand out again: all zero;
slots never freed keep the poison). Refused pools (DSA) and a pool class SGLang might add (a subclass
with one more tensor) are refused by the coverage table, naming the class and the tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache import memory_pool
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

from sglang_iso import coverage
from sglang_iso.integration.scrub import KvScrubber, kv_buffers, uncovered_tensors

SIZE = 64
LAYERS = 2


def _mha(cls: type) -> Any:
    return cls(SIZE, 1, torch.float32, 2, 32, LAYERS, "cpu", False)


def _mla(cls: type) -> Any:
    return cls(SIZE, 1, torch.float32, 64, 16, LAYERS, "cpu", False)


BUILDERS: dict[str, Callable[[type], Any]] = {
    "MHATokenToKVPool": _mha,
    "MHATokenToKVPoolFP4": _mha,
    "MHATokenToKVPoolMXFP8": _mha,
    "MLATokenToKVPool": _mla,
    "MLATokenToKVPoolFP4": _mla,
}


def _dsa_pool() -> Any:
    return memory_pool.DSATokenToKVPool(
        size=256, page_size=64, kv_lora_rank=64, dtype=torch.bfloat16, qk_rope_head_dim=16, layer_num=LAYERS,
        device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=80, index_buf_size=256,
    )  # fmt: skip


def _refusals(pool: Any) -> list[coverage.Refusal]:
    features = coverage.Features(
        stage="scheduler", kv_pool_class=type(pool).__name__, unscrubbed_tensors=uncovered_tensors(pool)
    )
    return coverage.refusals(features)


def test_every_served_pool_class_has_a_builder_here() -> None:
    assert set(BUILDERS) == set(coverage.COVERED_POOLS)


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


def test_dsa_pool_is_refused_naming_its_index_key_cache() -> None:
    pool = _dsa_pool()
    assert "DSATokenToKVPool.index_key_cache" in uncovered_tensors(pool)
    message = coverage.explain(_refusals(pool))
    assert "DSATokenToKVPool" in message and "index_key_cache" in message, message
    dsa = coverage.refusals(coverage.Features(stage="scheduler", dsa=True))
    assert [r.feature for r in dsa] == ["DSA sparse attention models (GLM-5, DeepSeek-V3.2, ...)"]


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
