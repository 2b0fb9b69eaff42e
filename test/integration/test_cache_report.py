"""``GET /iso/tenants`` rows from the scheduler: every row carries every counter, whatever made it."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_iso.identity.tags import NamespaceResolver
from sglang_iso.integration.cache_report import ROW_COUNTERS, SHARE_COUNTERS
from sglang_iso.integration.fairness import KvShares
from sglang_iso.integration.tenant_cache import TenantPolicy, TenantRadixCache

SIZE = 64


def make_cache() -> TenantRadixCache:
    kv = MHATokenToKVPool(
        size=SIZE, page_size=1, dtype=torch.float32, head_num=2, head_dim=4, layer_num=1, device="cpu",
        enable_memory_saver=False,
    )  # fmt: skip
    allocator = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", kv, need_sort=False)
    rows = ReqToTokenPool(size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=allocator, page_size=1)
    policies = {name: TenantPolicy(quota_tokens=q, policy="private") for name, q in (("acme", 32), ("globex", 48))}
    cache = TenantRadixCache(params, NamespaceResolver(None), policies)
    cache.kv_shares = KvShares(lambda owner: 0.5)
    return cache


def test_a_row_made_by_the_kv_share_path_alone_has_every_counter() -> None:
    cache = make_cache()
    slots = cache.token_to_kv_pool_allocator.alloc(4)
    assert slots is not None
    cache.insert(InsertParams(key=RadixKey([1, 2, 3, 4]), value=slots))  # an open-mode namespace: owner "open"
    cache.kv_shares.held_back["globex"] = 2  # globex was only ever held back: no namespace of its own yet
    rows = cache.tenant_stats()
    assert rows["open"]["resident_tokens"] == 4  # positive control: the namespace's row counts what it holds
    globex = rows["globex"]
    assert {*ROW_COUNTERS, *SHARE_COUNTERS, "namespaces"} <= globex.keys(), globex
    assert globex["held_back_requests"] == 2 and globex["namespaces"] == 0 and globex["resident_tokens"] == 0
    assert globex["quota_tokens_per_namespace"] == 48  # from its policy, as a namespace of its own would have


def test_lookup_counters_count_the_scheduler_lookups_only() -> None:
    """A request's checkpoint re-reads what it stored; that is not a lookup: a miss stays a miss in the row."""
    cache = make_cache()
    tokens = list(range(100, 116))
    key = RadixKey(tokens)
    assert cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len == 0  # the request's lookup: a miss
    slots = cache.token_to_kv_pool_allocator.alloc(len(tokens))
    assert slots is not None
    cache.req_to_token_pool.req_to_token[0, : len(tokens)] = slots.to(torch.int32)
    kv = SimpleNamespace(req_pool_idx=0, cache_protected_len=0, cache_inserted_len=0)
    req = SimpleNamespace(full_untruncated_fill_ids=tokens, extra_key=None, cache_salt=None, kv=kv, lock=None)
    cache.checkpoint(req, up_to=len(tokens))
    assert kv.cache_protected_len == len(tokens)  # the checkpoint stored the prefix and re-anchored the row
    row = cache.tenant_stats()["open"]
    assert row["lookup_tokens"] == len(tokens) and row["lookup_hit_tokens"] == 0, row
    again = cache.match_prefix(MatchPrefixParams(key=key))  # positive control: the next lookup hits and counts
    assert again.device_prefix_len == len(tokens)
    row = cache.tenant_stats()["open"]
    assert row["lookup_tokens"] == 2 * len(tokens) and row["lookup_hit_tokens"] == len(tokens), row
    cache.unlock(req.lock)
