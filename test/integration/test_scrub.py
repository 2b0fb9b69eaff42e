"""Poison and check: every free path zeroes the freed KV before the next owner gets it.

Real SGLang pools and allocators (CPU), our tenant cache and scrubber on top; a
recognizable pattern is written into a tenant's slots, the slots are freed on
each path, and the next allocation must return all-zero memory. Controls: slots
never freed keep their pattern, and without the scrubber the pattern survives
(so these tests can fail).
"""

from __future__ import annotations

from array import array

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_iso.identity.tags import NamespaceResolver
from sglang_iso.integration.scrub import KvScrubber
from sglang_iso.integration.tenant_cache import TenantRadixCache

SIZE = 64
LAYERS = 2
POISON = 7.0


def make(page_size: int, *, scrub: bool = True) -> tuple[TenantRadixCache, object, MHATokenToKVPool]:
    kv = MHATokenToKVPool(
        size=SIZE,
        page_size=page_size,
        dtype=torch.float32,
        head_num=2,
        head_dim=4,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
    )
    if page_size == 1:
        allocator: object = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", kv, need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(SIZE, page_size, torch.float32, "cpu", kv, need_sort=False)
    req_pool = ReqToTokenPool(size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(
        disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator, page_size=page_size
    )
    cache = TenantRadixCache(params, NamespaceResolver(None))
    if scrub:
        cache.scrubber = KvScrubber(allocator, req_pool).install()
    return cache, allocator, kv


def poison(kv: MHATokenToKVPool, slots: torch.Tensor) -> None:
    for layer in range(LAYERS):
        kv.k_buffer[layer][slots] = POISON
        kv.v_buffer[layer][slots] = -POISON


def rows(kv: MHATokenToKVPool, slots: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.cat([kv.k_buffer[i][slots], kv.v_buffer[i][slots]]) for i in range(LAYERS)])


def alloc_all(allocator: object) -> torch.Tensor:
    out = allocator.alloc(allocator.available_size())  # type: ignore[attr-defined]
    assert out is not None
    return out


def key(tokens: list[int], tenant: str) -> RadixKey:
    return RadixKey(array("q", tokens), extra_key=tenant)


@pytest.mark.parametrize("page_size", [1, 4])
def test_tree_eviction_path(page_size: int) -> None:
    cache, allocator, kv = make(page_size)
    slots = allocator.alloc(16)  # type: ignore[attr-defined]
    keep = allocator.alloc(8)  # type: ignore[attr-defined]
    poison(kv, slots)
    poison(kv, keep)
    cache.insert(InsertParams(key=key(list(range(16)), "a"), value=slots.to(torch.int64)))
    assert cache.evict(EvictParams(num_tokens=16)).num_tokens_evicted == 16
    handed_out = alloc_all(allocator)
    assert set(slots.tolist()) <= set(handed_out.tolist())
    assert torch.count_nonzero(rows(kv, slots)) == 0
    assert torch.all(rows(kv, keep).abs() == POISON)  # control: live slots untouched


@pytest.mark.parametrize("page_size", [1, 4])
def test_request_release_and_duplicate_paths(page_size: int) -> None:
    cache, allocator, kv = make(page_size)
    first, dup = allocator.alloc(8), allocator.alloc(8)  # type: ignore[attr-defined]
    poison(kv, first)
    poison(kv, dup)
    cache.insert(InsertParams(key=key(list(range(8)), "a"), value=first.to(torch.int64)))
    result = cache.tree.insert(cache._namespace(key(list(range(8)), "a")) or "", list(range(8)), dup.tolist())
    assert sorted(result.duplicate_indices) == sorted(dup.tolist())
    allocator.free(torch.tensor(result.duplicate_indices))  # type: ignore[attr-defined]  # duplicate path
    handed_out = alloc_all(allocator)
    assert set(dup.tolist()) <= set(handed_out.tolist())
    assert torch.count_nonzero(rows(kv, dup)) == 0
    released = dup
    poison(kv, released)
    allocator.free_segment(released, start_pos=0)  # type: ignore[attr-defined]  # request release path
    alloc_all(allocator)
    assert torch.count_nonzero(rows(kv, released)) == 0
    assert torch.all(rows(kv, first).abs() == POISON)  # the tree's entry is still live


def test_tenant_flush_path_and_batched_scrub() -> None:
    cache, allocator, kv = make(4)
    a, b = allocator.alloc(8), allocator.alloc(8)  # type: ignore[attr-defined]
    poison(kv, a)
    poison(kv, b)
    cache.insert(InsertParams(key=key(list(range(8)), "a"), value=a.to(torch.int64)))
    cache.insert(InsertParams(key=key(list(range(100, 108)), "b"), value=b.to(torch.int64)))
    ns_a = cache._namespace(key([0], "a")) or ""
    assert cache.tree.flush(ns_a) == 8
    calls = cache.scrubber.scrub_calls
    alloc_all(allocator)
    assert cache.scrubber.scrub_calls == calls + 1  # every pending page in one call
    assert torch.count_nonzero(rows(kv, a)) == 0
    assert torch.all(rows(kv, b).abs() == POISON)  # other tenant untouched


def test_freed_request_row_is_reset() -> None:
    cache, _, _ = make(1)
    pool = cache.req_to_token_pool
    (row,) = pool.alloc_rows(1)
    pool.req_to_token[row, :5] = torch.tensor([3, 4, 5, 6, 7], dtype=torch.int32)
    pool.free_rows([row])
    assert torch.count_nonzero(pool.req_to_token[row]) == 0


def test_without_scrubber_the_residue_survives() -> None:
    # Negative control: what upstream does, and what the tests above would catch.
    _, allocator, kv = make(1, scrub=False)
    slots = allocator.alloc(8)  # type: ignore[attr-defined]
    poison(kv, slots)
    allocator.free(slots)  # type: ignore[attr-defined]
    alloc_all(allocator)
    assert torch.all(rows(kv, slots).abs() == POISON)
