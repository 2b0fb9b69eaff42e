"""The hybrid tenant cache against SGLang's own unified tree with the SWA component, in process on CPU.

Both caches are built on SGLang's ``SWAKVPool`` and ``SWATokenToKVPoolAllocator`` (full and sliding-window sub-pools
joined by a full -> SWA map), on the Python tree core, with a window of 4 tokens, and driven through SGLang's cache
API by the same random multi-namespace trace: inserts of exchanges that extend a tenant's earlier ones or start anew,
matches of own extensions, of other tenants' tokens and of fresh tokens, and evictions of sliding-window KV (which
tombstones nodes outside the window, so later matches are bounded by where a window is still whole). Upstream keeps
namespaces apart by ``extra_key``; every match length and every eviction result must be the same in both, the
trace has hits and tombstones (control), and the tenant cache's integrity check holds at the end. A key without a
verified tag matches and stores nothing, where upstream shares by the raw string (control).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_iso.identity.tags import NamespaceResolver, make_tag
from sglang_iso.integration.hybrid_cache import TenantHybridCache

SECRET = b"s" * 32
TOKENS, TOKENS_SWA, WINDOW = 4096, 2048, 4
TENANTS = ("acme", "globex", "hooli")


def _tag(tenant: str) -> str:
    return make_tag(SECRET, tenant, "a" * 64)


def _build(cls: type[UnifiedRadixCache]) -> Any:
    pool = SWAKVPool(
        size=TOKENS, size_swa=TOKENS_SWA, page_size=1, dtype=torch.float32, head_num=1, head_dim=2,
        swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu",
    )  # fmt: skip
    allocator = SWATokenToKVPoolAllocator(TOKENS, TOKENS_SWA, 1, torch.float32, "cpu", pool, need_sort=False)
    rows = ReqToTokenPool(size=8, max_context_len=512, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(
        disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=allocator, page_size=1,
        tree_components=(ComponentType.FULL, ComponentType.SWA), tree_core_backend="python",
        sliding_window_size=WINDOW,
    )  # fmt: skip
    cache = cls(params)
    if isinstance(cache, TenantHybridCache):
        cache.configure(NamespaceResolver(SECRET), {})
    return cache


def _insert(cache: Any, extra_key: str, tokens: list[int]) -> int:
    """One finished exchange's KV handed to the tree; returns the prefix the tree already held (SGLang's unified tree
    frees the exchange's copies of it itself)."""
    slots = cache.token_to_kv_pool_allocator.alloc(len(tokens)).to(torch.int64)
    return int(cache.insert(InsertParams(key=RadixKey(tokens, extra_key), value=slots)).prefix_len)


def _match(cache: Any, extra_key: str | None, tokens: list[int]) -> int:
    return int(cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, extra_key))).device_prefix_len)


def _trace(seed: int, steps: int) -> list[tuple[str, str, list[int]]]:
    rng = random.Random(seed)
    sent: dict[str, list[list[int]]] = {t: [] for t in TENANTS}
    out: list[tuple[str, str, list[int]]] = []
    for _ in range(steps):
        tenant = rng.choice(TENANTS)
        if rng.random() < 0.1:
            out.append(("evict", tenant, [rng.randrange(4, 40)]))
            continue
        pool = sent[tenant] if rng.random() < 0.7 else sent[rng.choice(TENANTS)]
        base = rng.choice(pool) if pool and rng.random() < 0.8 else []
        tokens = base[: rng.randrange(len(base) + 1)] if base and rng.random() < 0.3 else list(base)
        tokens += [rng.randrange(3, 500) for _ in range(rng.randrange(1, 16))]
        op = "insert" if rng.random() < 0.5 else "match"
        if op == "insert":
            sent[tenant].append(tokens)
        out.append((op, tenant, tokens))
    return out


def _tombstones(cache: Any) -> int:
    return sum(
        1
        for node, _ in cache._nodes()
        if node.component_data[ComponentType.SWA].value is None
        and node.component_data[ComponentType.FULL].value is not None
    )


@pytest.mark.parametrize("seed", range(6))
def test_differential_against_upstream_on_random_multi_namespace_traces(seed: int) -> None:
    ours, theirs = _build(TenantHybridCache), _build(UnifiedRadixCache)
    hits = tombstones = 0
    for op, tenant, tokens in _trace(seed, 150):
        if op == "insert":
            assert _insert(ours, _tag(tenant), tokens) == _insert(theirs, _tag(tenant), tokens)
        elif op == "evict":
            params = EvictParams(swa_num_tokens=tokens[0])
            assert ours.evict(params).num_tokens_evicted == theirs.evict(params).num_tokens_evicted
            tombstones = max(tombstones, _tombstones(ours))
        else:
            got = _match(ours, _tag(tenant), tokens)
            assert got == _match(theirs, _tag(tenant), tokens), (tenant, tokens)
            hits += got > 0
    assert hits > 0 and tombstones > 0  # the trace reuses windows and tombstones nodes (control)
    assert ours.check_integrity() and ours.counters["foreign_nodes"] == 0
    assert ours.evictable_size() == theirs.evictable_size()
    assert ours.swa_evictable_size() == theirs.swa_evictable_size()
    allocator = ours.token_to_kv_pool_allocator  # nothing leaked or freed twice on either sub-pool
    assert allocator.full_available_size() + ours.evictable_size() == TOKENS
    assert allocator.swa_available_size() + ours.swa_evictable_size() == TOKENS_SWA


@pytest.mark.parametrize("extra_key", [_tag("acme")[:-2] + "00", "plain-string", None])
def test_a_key_without_a_verified_tag_matches_and_stores_nothing(extra_key: str | None) -> None:
    ours, theirs = _build(TenantHybridCache), _build(UnifiedRadixCache)
    tokens = list(range(3, 23))
    _insert(ours, extra_key, tokens)  # type: ignore[arg-type]
    _insert(theirs, extra_key, tokens)  # type: ignore[arg-type]
    assert _match(theirs, extra_key, tokens) > 0  # control: upstream shares by the raw key
    assert _match(ours, extra_key, tokens) == 0 and ours.evictable_size() == 0
    _insert(ours, _tag("acme"), tokens)
    assert _match(ours, _tag("acme"), tokens) > 0  # control: a verified tag stores and matches
