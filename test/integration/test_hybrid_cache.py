"""The hybrid tenant cache against SGLang's own unified tree with the Mamba component, in process on CPU.

Both caches are built on SGLang's ``HybridReqToTokenPool`` (state slots) and a token allocator, on the Python tree
core, and driven through SGLang's cache API (``insert`` with a state slot per exchange, ``match_prefix``):

* differential: random multi-namespace traces of inserts and matches (verified tags) give the same match lengths and
  the same state snapshot in both (upstream keeps namespaces apart by ``extra_key``; ours must not change what it
  matches); the trace has hits (control);
* a key without a verified tag (a forged MAC, an unknown tenant, a raw string, none) stores and matches nothing,
  where upstream would match the nodes inserted under that string;
* a node of one namespace planted under another's walk (a corrupted tree) is served as a miss and counted; the same
  plant in upstream's tree is a hit (control: the check, not the tree's keying, catches it);
* an erase drops exactly the owner's nodes and frees their state slots;
* a quota keeps a namespace's resident tokens under it by its own least recently used leaves, nodes a request holds
  staying, other owners untouched.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MHATokenToKVPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_iso.identity.tags import NamespaceResolver, make_tag
from sglang_iso.integration.hybrid_cache import TenantHybridCache
from sglang_iso.integration.tenant_cache import TenantPolicy

SECRET = b"s" * 32
SLOTS = 64
TOKENS = 4096
TENANTS = ("acme", "globex", "hooli")


@pytest.fixture(autouse=True, scope="module")
def _server_args() -> Iterator[None]:
    """SGLang's Mamba component reads its checkpoint grid from the process's server args (no model behind them)."""
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path="dummy", device="cpu")
    args._mamba_cache_chunk_size = 1  # type: ignore[attr-defined]
    publish(args, role="scheduler")
    yield
    reset_context()


def _tag(tenant: str, ns_id: str = "a" * 64) -> str:
    return make_tag(SECRET, tenant, ns_id)


def _build(cls: type[UnifiedRadixCache], **quotas: int) -> Any:
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=4, head_dim=8, state_size=4, conv_kernel=4
    )
    rows = HybridReqToTokenPool(
        size=8, mamba_size=SLOTS, mamba_spec_state_size=SLOTS, max_context_len=512, device="cpu",
        enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=shape, layers=[0]), mamba_layer_ids=[0],
        enable_mamba_extra_buffer=False, enable_overlap_schedule=False,
    )  # fmt: skip
    kv = MHATokenToKVPool(size=TOKENS, page_size=1, dtype=torch.float32, head_num=1, head_dim=2, layer_num=1,
                          device="cpu", enable_memory_saver=False)  # fmt: skip
    allocator = TokenToKVPoolAllocator(TOKENS, torch.float32, "cpu", kv, need_sort=False)
    params = CacheInitParams(
        disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=allocator, page_size=1,
        tree_components=(ComponentType.FULL, ComponentType.MAMBA), tree_core_backend="python",
    )  # fmt: skip
    cache = cls(params)
    if isinstance(cache, TenantHybridCache):
        policies = {
            "hooli": TenantPolicy(quota_tokens=None, policy="private"),
            "initech": TenantPolicy(quota_tokens=None, policy="off"),
            **{owner: TenantPolicy(quota_tokens=tokens, policy="private") for owner, tokens in quotas.items()},
        }
        cache.configure(NamespaceResolver(SECRET), policies)
    return cache


def _insert(cache: Any, extra_key: str, tokens: list[int]) -> int:
    """One finished exchange: its KV slots and its state slot handed to the tree; returns the matched prefix."""
    allocator = cache.token_to_kv_pool_allocator
    slots = allocator.alloc(len(tokens))
    state = cache.req_to_token_pool.mamba_allocator.alloc(1)
    # NOTE: SGLang's unified tree frees the exchange's copies of a prefix it already held itself
    result = cache.insert(InsertParams(key=RadixKey(tokens, extra_key), value=slots.to(torch.int64), mamba_value=state))
    if getattr(result, "mamba_exist", False):
        cache.req_to_token_pool.mamba_allocator.free(state)
    return int(result.prefix_len)


def _match(cache: Any, extra_key: str | None, tokens: list[int]) -> tuple[int, Any]:
    """(matched tokens, the state slot of the node the match ends on or None)."""
    result = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, extra_key)))
    state = cache.tree_core.get_component_device_value(result.best_match_node, ComponentType.MAMBA)
    return int(result.device_prefix_len), state is not None


def _trace(seed: int, steps: int) -> list[tuple[str, str, list[int]]]:
    """(op, tenant, tokens): inserts of exchanges that extend a tenant's earlier ones or start anew, and matches of
    own extensions, of another tenant's tokens and of fresh tokens."""
    rng = random.Random(seed)
    sent: dict[str, list[list[int]]] = {t: [] for t in TENANTS}
    out = []
    for _ in range(steps):
        tenant = rng.choice(TENANTS)
        pool = sent[tenant] if rng.random() < 0.7 else sent[rng.choice(TENANTS)]
        base = rng.choice(pool) if pool and rng.random() < 0.8 else []
        tokens = base[: rng.randrange(len(base) + 1)] if base and rng.random() < 0.3 else list(base)
        tokens += [rng.randrange(3, 500) for _ in range(rng.randrange(1, 12))]
        op = "insert" if rng.random() < 0.5 else "match"
        if op == "insert":
            sent[tenant].append(tokens)
        out.append((op, tenant, tokens))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_differential_against_upstream_on_random_multi_namespace_traces(seed: int) -> None:
    ours, theirs = _build(TenantHybridCache), _build(UnifiedRadixCache)
    hits = 0
    for op, tenant, tokens in _trace(seed, 120):
        if op == "insert":
            assert _insert(ours, _tag(tenant), tokens) == _insert(theirs, _tag(tenant), tokens)
        else:
            got = _match(ours, _tag(tenant), tokens)
            assert got == _match(theirs, _tag(tenant), tokens), (tenant, tokens)
            hits += got[0] > 0
    assert hits > 0  # the trace reuses snapshots (a cache that never matches would pass the equalities too)
    assert ours.check_integrity() and ours.counters["foreign_nodes"] == 0
    assert ours.evictable_size() == theirs.evictable_size()
    # nothing leaked or freed twice: every KV slot and state slot is free or in the tree
    assert ours.token_to_kv_pool_allocator.available_size() + ours.evictable_size() == TOKENS
    assert ours.req_to_token_pool.mamba_allocator.available_size() + ours.mamba_evictable_size() == SLOTS


@pytest.mark.parametrize(
    "extra_key",
    [_tag("acme")[:-64] + "0" * 64, make_tag(b"x" * 32, "acme", "a" * 64), "acme", None],
    ids=["forged-mac", "other-secret", "raw-string", "none"],
)
def test_a_key_without_a_verified_tag_matches_nothing(extra_key: str | None) -> None:
    ours, theirs = _build(TenantHybridCache), _build(UnifiedRadixCache)
    tokens = list(range(10, 30))
    for cache in (ours, theirs):
        _insert(cache, extra_key, tokens)  # type: ignore[arg-type]
        _insert(cache, _tag("acme"), tokens)
    assert len(theirs.tree_core.root_node.children) == 2
    assert _match(theirs, extra_key, tokens) == (20, True)  # upstream shares by the raw string
    assert _match(ours, extra_key, tokens) == (0, False)
    assert len(ours.tree_core.root_node.children) == 1  # nothing was stored under it
    assert _match(ours, _tag("acme"), tokens) == (20, True)  # control: the verified tag hits
    assert ours.counters["unverified"] >= 1 and ours.check_integrity()


def test_a_tenant_with_the_cache_off_stores_and_matches_nothing_but_keeps_its_owner() -> None:
    cache = _build(TenantHybridCache)
    tokens = list(range(200, 220))
    assert _insert(cache, _tag("initech"), tokens) == 0
    assert _match(cache, _tag("initech"), tokens) == (0, False)
    assert len(cache.tree_core.root_node.children) == 0
    assert cache.namespace_of_request(_tag("initech"), None) is not None  # its rows still have an owner
    assert cache.counters["unverified"] == 0  # a verified tag, not a forged one
    _insert(cache, _tag("hooli"), tokens)
    assert _match(cache, _tag("hooli"), tokens) == (20, True)  # control: a private tenant stores and hits


def test_an_edge_into_another_namespace_is_a_counted_miss_not_a_crash() -> None:
    """A corrupted child table: globex's walk for acme's tokens is sent to acme's node. SGLang's walk raises on the
    foreign key (a scheduler crash); ours serves a miss and counts it."""
    ours, theirs = _build(TenantHybridCache), _build(UnifiedRadixCache)
    tokens = list(range(40, 60))
    for cache in (ours, theirs):
        _insert(cache, _tag("acme"), tokens)
        root = cache.tree_core.root_node
        (acme_node,) = root.children.values()
        root.children[RadixKey(tokens, _tag("globex")).child_key(1)] = acme_node
    with pytest.raises(ValueError, match="matching extra_key"):
        _match(theirs, _tag("globex"), tokens)  # control: the walk reaches the planted edge
    assert _match(ours, _tag("globex"), tokens) == (0, False)
    assert ours.counters["foreign_nodes"] == 1
    assert _match(ours, _tag("acme"), tokens) == (20, True)  # the owner still hits


def test_a_relabelled_node_under_another_namespaces_parent_is_a_counted_miss() -> None:
    """A node of acme's subtree relabelled with globex's key and hung under globex's node (its parent pointer still
    acme's): the walk accepts it; the check up to the root finds acme's parent. Upstream serves it (control)."""
    ours, theirs = _build(TenantHybridCache), _build(UnifiedRadixCache)
    head, tail = list(range(40, 50)), list(range(50, 60))
    for cache in (ours, theirs):
        _insert(cache, _tag("acme"), head)
        _insert(cache, _tag("acme"), head + tail)
        _insert(cache, _tag("globex"), head)
        by_scope = {child.key.extra_key: child for child in cache.tree_core.root_node.children.values()}
        acme_head, globex_head = by_scope[_tag("acme")], by_scope[_tag("globex")]
        (acme_tail,) = acme_head.children.values()
        acme_tail.key = RadixKey(acme_tail.key.token_ids, _tag("globex"))
        globex_head.children[acme_tail.key.child_key(1)] = acme_tail
    assert _match(theirs, _tag("globex"), head + tail) == (20, True)
    assert _match(ours, _tag("globex"), head + tail) == (0, False)
    assert ours.counters["foreign_nodes"] == 1 and not ours.check_integrity()
    assert _match(ours, _tag("globex"), head) == (10, True)  # control: globex's own node still hits


def test_an_erase_drops_the_owners_nodes_and_their_state_slots_only() -> None:
    cache = _build(TenantHybridCache)
    free_before = cache.req_to_token_pool.mamba_allocator.available_size()
    acme, globex = list(range(5, 25)), list(range(100, 130))
    _insert(cache, _tag("acme"), acme)
    _insert(cache, _tag("acme"), [*acme, 7, 8, 9])
    _insert(cache, _tag("globex"), globex)
    receipt = cache.erase_owner("acme", scrub_now=False)
    assert receipt["device_tokens_dropped"] == 23 and receipt["device_tokens_held"] == 0
    assert _match(cache, _tag("acme"), [*acme, 7, 8, 9]) == (0, False)
    assert _match(cache, _tag("globex"), globex) == (30, True)  # control: another owner's nodes stay
    assert cache.req_to_token_pool.mamba_allocator.available_size() == free_before - 1  # globex's snapshot only
    stats = cache.tenant_stats()
    assert stats["globex"]["resident_tokens"] == 30 and stats["acme"]["resident_tokens"] == 0


def _balanced(cache: Any) -> bool:
    """Every KV slot and state slot is free or in the tree (nothing leaked, nothing freed twice)."""
    kv = cache.token_to_kv_pool_allocator.available_size() + cache.evictable_size() + cache.protected_size()
    state = cache.req_to_token_pool.mamba_allocator.available_size() + cache.mamba_evictable_size()
    return kv == TOKENS and state + cache.mamba_protected_size() == SLOTS


def test_a_quota_evicts_the_namespaces_own_least_recently_used_exchanges_only() -> None:
    cache = _build(TenantHybridCache, acme=40)
    first, second, third = (list(range(base, base + 20)) for base in (5, 200, 400))
    globex = list(range(100, 160))  # over acme's quota, but globex has none
    for tokens in (first, second):
        _insert(cache, _tag("acme"), tokens)
    _insert(cache, _tag("globex"), globex)
    _insert(cache, _tag("acme"), third)  # 60 resident: over the quota from here
    assert cache.tenant_stats()["acme"]["resident_tokens"] == 60  # not inside the insert (its caller may lock)
    assert _match(cache, _tag("acme"), third) == (20, True)  # the next tree operation enforces; the newest stays
    assert _match(cache, _tag("acme"), first) == (0, False)  # the least recently used went
    assert _match(cache, _tag("acme"), second) == (20, True)
    assert _match(cache, _tag("globex"), globex) == (60, True)  # control: another owner's nodes stay
    assert cache.counters["quota_evicted_tokens"] == 20
    assert cache.tenant_stats()["acme"]["resident_tokens"] == 40
    assert _balanced(cache) and cache.check_integrity()


def test_a_quota_leaves_the_nodes_a_request_holds() -> None:
    cache = _build(TenantHybridCache, acme=20)
    held, other = list(range(5, 25)), list(range(300, 320))
    _insert(cache, _tag("acme"), held)
    result = cache.match_prefix(MatchPrefixParams(key=RadixKey(held, _tag("acme"))))
    assert int(result.device_prefix_len) == 20  # at the quota, not over: the exchange stays and matches
    lock = cache.inc_lock_ref(result.last_device_node)  # a running request holds it
    _insert(cache, _tag("acme"), other)
    assert _match(cache, _tag("acme"), other) == (0, False)  # evicted, though newer: the only unlocked leaf
    assert cache.tenant_stats()["acme"]["protected_tokens"] == 20  # the held one stays
    cache.dec_lock_ref(result.last_device_node, lock.to_dec_params())
    _insert(cache, _tag("acme"), other)
    assert _match(cache, _tag("acme"), other) == (20, True)  # released: now the least recently used one goes
    assert _match(cache, _tag("acme"), held) == (0, False)
    assert cache.counters["quota_evicted_tokens"] == 40
    assert _balanced(cache) and cache.check_integrity()


def test_the_report_exports_residency_quota_evictions_and_violations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hybrid tree's rows go to the Prometheus series and the audit log as the tenant tree's do: acme's
    residency and quota (gauges), the tokens its quota evicted and globex's violation (counters, audited)."""
    from sglang_iso import observability
    from sglang_iso_testing.fake_metrics import RecordedMetrics

    recorded, audits = RecordedMetrics(), []
    monkeypatch.setattr(observability, "metrics", lambda: recorded)
    monkeypatch.setattr(observability, "audit", lambda event, **fields: audits.append((event, fields)))
    cache = _build(TenantHybridCache, acme=20)
    older, newer = list(range(5, 25)), list(range(200, 220))
    _insert(cache, _tag("acme"), older)
    _insert(cache, _tag("acme"), newer)
    assert _match(cache, _tag("acme"), newer) == (20, True)  # the older exchange goes to the quota
    cache.report.maybe_export(min_interval_s=0)
    calls = recorded.calls
    acme, globex = (("tenant", "acme"),), (("tenant", "globex"),)
    assert calls[("resident_tokens", acme)][-1] == ("set", 20)
    assert calls[("quota_tokens", acme)][-1] == ("set", 20)
    assert calls[("evicted_tokens", acme)] == [("inc", 20)]
    root = cache.tree_core.root_node
    (acme_node,) = root.children.values()
    root.children[RadixKey(newer, _tag("globex")).child_key(1)] = acme_node  # a corrupted child table
    assert _match(cache, _tag("globex"), newer) == (0, False)
    cache.report.maybe_export(min_interval_s=0)
    assert calls[("violations", globex)] == [("inc", 1)]
    assert calls[("violations", acme)] == []  # control: the series exists for acme, with nothing counted
    assert ("isolation_violation", {"tenant": "globex", "count": 1}) in audits
    cache.report.maybe_export(min_interval_s=0)
    assert calls[("violations", globex)] == [("inc", 1)]  # counters go out as deltas: nothing twice
