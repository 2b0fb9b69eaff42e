"""The host (L2) tier on real SGLang pools (CPU): write-back, load-back in the own namespace only, scrubbing.

Each slot's KV gets a recognizable value; after eviction to the host and a hit,
the reloaded device slots must hold exactly the original values (positive
control), another tenant must get no reuse, and every host page that leaves the
tier must be zero while pages still held keep their values (so the scrub checks
can fail).
"""

from __future__ import annotations

from array import array

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_iso import coverage
from sglang_iso.integration.host_cache import HostCache, host_capacity_tokens
from test.integration.test_scrub import LAYERS, make


def key(tokens: list[int], tenant: str) -> RadixKey:
    return RadixKey(array("q", tokens), extra_key=tenant)


def with_host(page_size: int, host_tokens: int = 64) -> tuple:
    cache, allocator, kv = make(page_size)
    cache.host = HostCache(cache, host_tokens)
    cache.tree.set_spill(cache.host.spill)
    return cache, allocator, kv


def fill(kv, slots: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    """Slot s holds s + 1 (K) and -(s + 1) (V) in every layer: recognizable after any move."""
    value = (slots.to(torch.float32) + 1).view(-1, 1, 1)
    for layer in range(LAYERS):
        kv.k_buffer[layer][slots] = value.expand(-1, *kv.k_buffer[layer].shape[1:]).clone()
        kv.v_buffer[layer][slots] = -value.expand(-1, *kv.v_buffer[layer].shape[1:]).clone()


def k_values(kv, slots: torch.Tensor) -> list[float]:  # type: ignore[no-untyped-def]
    return [float(kv.k_buffer[0][int(s)][0, 0]) for s in slots]


def cached(cache, tokens: list[int], tenant: str):  # type: ignore[no-untyped-def]
    return cache.match_prefix(MatchPrefixParams(key=key(tokens, tenant)))


def store(cache, allocator, kv, tokens: list[int], tenant: str) -> torch.Tensor:  # type: ignore[no-untyped-def]
    slots = allocator.alloc(len(tokens))
    fill(kv, slots)
    cache.insert(InsertParams(key=key(tokens, tenant), value=slots))
    return slots


@pytest.mark.parametrize("page_size", [1, 4])
def test_evicted_prefix_comes_back_in_own_namespace_only(page_size: int) -> None:
    cache, allocator, kv = with_host(page_size)
    tokens = list(range(100, 116))
    original = k_values(kv, store(cache, allocator, kv, tokens, "tenant-a"))
    assert cache.evict(EvictParams(num_tokens=16)).num_tokens_evicted == 16
    assert cache.evictable_size() == 0
    assert cache.host.tier.used_pages() * page_size == 16
    assert cache.host.logical_size - cache.host.available_size() == 16  # what SGLang's metrics read

    other = cached(cache, tokens, "tenant-b")
    assert other.device_prefix_len == 0  # B: no reuse from the host
    assert cache.host.tier.used_pages() * page_size == 16  # and B's lookup took nothing

    hit = cached(cache, tokens, "tenant-a")
    assert hit.device_prefix_len == 16  # positive control: A hits from the host
    indices = cache.path_device_indices(hit.last_device_node)
    assert k_values(kv, indices) == original  # the reloaded KV is exactly A's
    assert cache.host.tier.used_pages() == 0
    stats = next(iter(cache.tenant_stats().values()))
    assert stats["host_loaded_tokens"] == 16
    # One lookup counts once: its 16 tokens asked for, none of them found on the device (they came from the host).
    own = cache.tree.stats(cache._namespace(key(tokens, "tenant-a")))
    assert own.lookup_tokens == 16 and own.hit_tokens == 0, own
    assert cache.check_integrity()
    cache.host.tier.check_integrity()
    status = cache.iso_status()  # the synchronous tier work is timed: one spill, two load-backs (B's and A's)
    assert status["tier_spill_calls"] == 1 and status["tier_load_calls"] == 2, status
    assert status["tier_spill_us"] > 0 and status["tier_load_us"] > 0 and status["tier_l3_write_us"] == 0


@pytest.mark.parametrize("page_size", [1, 4])
def test_host_pages_are_scrubbed_on_every_exit(page_size: int) -> None:
    cache, allocator, kv = with_host(page_size, host_tokens=32)
    host = cache.host
    a = list(range(200, 216))
    store(cache, allocator, kv, a, "tenant-a")
    cache.evict(EvictParams(num_tokens=16))
    pages_a = host.tier.lookup(next(iter(cache._configured)), array("q", a), 0)
    assert len(pages_a) * page_size == 16

    def host_rows(pages: list[int]) -> torch.Tensor:
        return torch.stack([buf[host._host_slots(pages)] for buf in host.host_buffers])

    assert bool((host_rows(pages_a) != 0).all())  # control: held pages keep their values

    # Load-back: the pages leave the tier -> zero.
    assert cached(cache, a, "tenant-a").device_prefix_len == 16
    assert bool((host_rows(pages_a) == 0).all())

    # Flush of a tenant: its host pages -> zero.
    cache.evict(EvictParams(num_tokens=16))
    ns_a = next(iter(cache._configured))
    pages_a = host.tier.lookup(ns_a, array("q", a), 0)
    assert bool((host_rows(pages_a) != 0).all())
    cache.flush_owner("*")
    assert bool((host_rows(pages_a) == 0).all()) and host.tier.used_pages() == 0

    # Host full: the LRU page is dropped, zeroed, and reused for someone else.
    b, c = list(range(300, 332)), list(range(400, 416))
    store(cache, allocator, kv, b, "tenant-b")
    cache.evict(EvictParams(num_tokens=32))  # fills the host (32 tokens)
    store(cache, allocator, kv, c, "tenant-c")
    cache.evict(EvictParams(num_tokens=16))  # B's oldest pages are dropped for C's
    assert host.tier.dropped_pages * page_size == 16
    assert host.scrubbed_pages >= 2 * 16 // page_size
    assert cached(cache, c, "tenant-c").device_prefix_len == 16
    assert cache.check_integrity()
    host.tier.check_integrity()


def test_sizing_and_refusals() -> None:
    class Args:
        hicache_ratio = None
        hicache_size = 0
        hicache_storage_backend = "file"
        hicache_host_memory_mode = "cache"

    assert host_capacity_tokens(Args(), 1000, 64) == 2000
    Args.hicache_size = 1
    assert host_capacity_tokens(Args(), 1000, 1024) == (1 << 30) // 1024
    features = coverage.Features.from_server_args(
        Args(), kv_owner_check=True, tenants_file=True, hierarchical_cache=True
    )
    refused = coverage.refusals(features)
    assert len(refused) == 1 and "--hicache-storage-backend file reaching SGLang" in refused[0].message


def test_tenant_quota_caps_its_host_residency_too() -> None:
    from sglang_iso.identity.tags import NamespaceResolver, make_tag
    from sglang_iso.integration.tenant_cache import TenantPolicy, TenantRadixCache

    cache, allocator, kv = make(1)
    secret = b"k" * 32
    capped = TenantRadixCache(
        _params(cache),
        NamespaceResolver(secret),
        {"acme": TenantPolicy(quota_tokens=8, policy="private", host_quota_tokens=8)},
    )
    capped.host = HostCache(capped, 64)
    capped.tree.set_spill(capped.host.spill)
    tag = make_tag(secret, "acme", "a" * 64)
    first, second = list(range(600, 608)), list(range(700, 708))
    store(capped, allocator, kv, first, tag)
    capped.evict(EvictParams(num_tokens=8))
    store(capped, allocator, kv, second, tag)
    capped.evict(EvictParams(num_tokens=8))  # the host would hold 16 of acme's tokens: its oldest 8 go
    assert capped.tenant_stats()["acme"]["host_resident_tokens"] == 8
    assert cached(capped, first, tag).device_prefix_len == 0
    assert cached(capped, second, tag).device_prefix_len == 8  # control: the newer prefix is still there
    capped.host.tier.check_integrity()


def _params(cache):  # type: ignore[no-untyped-def]
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    return CacheInitParams(
        disable=False,
        req_to_token_pool=cache.req_to_token_pool,
        token_to_kv_pool_allocator=cache.token_to_kv_pool_allocator,
        page_size=cache.page_size,
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_shared_prefix_comes_back_for_its_readers_only(page_size: int) -> None:
    from sglang_iso.identity.tags import NamespaceResolver, make_tag
    from sglang_iso.integration.shared_prefixes import SCOPE
    from sglang_iso.integration.tenant_cache import TenantRadixCache

    base, allocator, kv = make(page_size)
    secret = b"k" * 32
    cache = TenantRadixCache(_params(base), NamespaceResolver(secret))
    cache.host = HostCache(cache, 64)
    cache.tree.set_spill(cache.host.spill)
    head = list(range(300, 308))
    cache.tree.declare_shared("sys", head, frozenset({"acme", "initech"}), scope=SCOPE)
    acme, initech, globex = (make_tag(secret, t, c * 64) for t, c in (("acme", "a"), ("initech", "b"), ("globex", "c")))
    full = head + list(range(400, 408))
    original = k_values(kv, store(cache, allocator, kv, full, acme))
    assert cache.evict(EvictParams(num_tokens=len(full))).num_tokens_evicted == len(full)
    assert cache.host.tier.stats("shared:sys").resident_tokens == len(head)
    assert cache.iso_status()["host_shared_resident_tokens"] == len(head)

    assert cached(cache, full, globex).device_prefix_len == 0  # not a reader: neither the prefix nor acme's tail
    assert cache.resolver.rejected_tags == 0  # (the miss above is the tree's, not a refused tag's)
    hit = cached(cache, full, acme)  # positive control: the prefix, then acme's own continuation
    assert hit.device_prefix_len == len(full)
    assert k_values(kv, cache.path_device_indices(hit.last_device_node)) == original
    cache.host.tier.check_integrity()
    assert cache.check_integrity()

    cache.evict(EvictParams(num_tokens=len(full)))
    other = cached(cache, head + list(range(500, 508)), initech)  # another reader: the prefix only
    assert other.device_prefix_len == len(head)
    assert k_values(kv, cache.path_device_indices(other.last_device_node)) == original[: len(head)]
    assert cache.host.tier.stats("shared:sys").resident_tokens == 0  # taken back to the device
    assert cache.iso_status()["host_shared_loaded_tokens"] == 2 * len(head)  # for acme, then for initech
    assert cache.check_integrity()
