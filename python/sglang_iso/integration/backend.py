"""The ``tenant`` radix cache backend factory (runs in the scheduler process)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sglang_iso import coverage
from sglang_iso.coverage import NotCoveredError
from sglang_iso.identity.tags import NamespaceResolver
from sglang_iso.integration import hook_table, runtime
from sglang_iso.integration.tenant_cache import TenantPolicy, TenantRadixCache
from sglang_iso.settings import Settings
from sglang_iso.settings import current as current_settings

if TYPE_CHECKING:
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext

logger = logging.getLogger(__name__)

__all__ = ["TenantRadixCache", "build_tenant_cache"]

TREE_CORE = "python"
"""SGLang's tree core the hybrid cache runs on (``CacheInitParams.tree_core_backend``)."""


def build_tenant_cache(ctx: TreeCacheBuildContext) -> BasePrefixCache:
    """Factory registered under ``tenant``.

    Raises:
        RuntimeError: a hook sglang-iso needs was not applied in this process
            (SGLang logs and skips failing hooks; we refuse instead).
        NotCoveredError: a feature the coverage table refuses at the scheduler
            (:mod:`sglang_iso.coverage`: DSA and hybrid SWA/Mamba models, KV pool classes outside the
            model-family table or with tensors scrub-on-free does not zero, uncovered speculative or HiCache setups,
            owner-check gaps, PD without a tenants file).
    """
    missing = hook_table.missing(required=hook_table.Required.SCHEDULER)
    if missing:
        raise RuntimeError(f"sglang-iso: required hooks were not applied in the scheduler process: {missing}")
    from sglang_iso.integration.scrub import unscrubbed_tensors

    settings = current_settings()
    config = settings.tenants()
    allocator = getattr(ctx.params, "token_to_kv_pool_allocator", None)
    kvcache = allocator.get_kvcache() if allocator is not None else None
    features = coverage.Features.from_server_args(
        ctx.server_args,
        kv_owner_check=settings.kv_owner_check and not bool(getattr(ctx.params, "disable", False)),
        tenants_file=config is not None,
        hierarchical_cache=bool(ctx.enable_hierarchical_cache),
        hybrid_swa=bool(ctx.is_hybrid_swa),
        hybrid_ssm=bool(ctx.is_hybrid_ssm),
        dsa=bool(ctx.is_dsa),
        attention_sinks=_has_attention_sinks(ctx.server_args),
        kv_pool_class=None if kvcache is None else type(kvcache).__name__,
        unscrubbed_tensors=frozenset() if kvcache is None or not settings.kv_scrub else unscrubbed_tensors(kvcache),
        tenant_limits=_tenant_limits(config),
    )
    refused = coverage.refusals(features)
    if refused:
        raise NotCoveredError(f"sglang-iso: {coverage.explain(refused)}")
    policies: dict[str, TenantPolicy] = {}
    if config is not None:
        for tenant in config.tenants.values():
            policies[tenant.group or tenant.id] = TenantPolicy(
                quota_tokens=tenant.quota_tokens,
                policy=tenant.cache_policy,
                host_quota_tokens=tenant.host_quota_tokens,
                l3_quota_tokens=tenant.l3_quota_tokens,
            )
    resolver = NamespaceResolver(config.secret if config is not None else None)
    if ctx.is_hybrid_ssm or ctx.is_hybrid_swa:
        return _build_hybrid_cache(ctx, settings, resolver, policies)
    cache = TenantRadixCache(ctx.params, resolver, policies)
    if config is not None:
        from sglang_iso.integration.fairness import KvShares

        cache.kv_shares = KvShares(config.kv_share_of)
    if settings.kv_scrub and cache.token_to_kv_pool_allocator is not None:
        from sglang_iso.integration.scrub import make_scrubber

        forward_stream = getattr(getattr(ctx.tp_worker, "model_runner", None), "forward_stream", None)
        cache.scrubber = make_scrubber(cache.token_to_kv_pool_allocator, cache.req_to_token_pool, forward_stream)
    if ctx.enable_hierarchical_cache and not cache.disable and cache.token_to_kv_pool_allocator is not None:
        _attach_host_tier(cache, ctx, settings, config.secret if config is not None else None)
    if settings.kv_owner_check and not cache.disable:
        from sglang_iso.integration import owner_check

        cache.page_owners = owner_check.OwnerTable(cache).install()
    _attach_pd_guard(cache, ctx, settings, config.secret if config is not None else None)
    if config is not None and config.shared_prefixes and not cache.disable:
        from sglang_iso.integration.shared_prefixes import declare_shared_prefixes

        tokenizer = _server_tokenizer(ctx.server_args)
        declare_shared_prefixes(cache.tree, config, tokenizer, cache.page_size, cache.tree_key)
    runtime.install(runtime.SchedulerRuntime(settings, cache, page_owners=cache.page_owners, pd_guard=cache.pd_guard))
    logger.info("sglang-iso: tenant tree cache built (namespace mode %s)", cache.resolver.mode)
    return cache


def _build_hybrid_cache(
    ctx: TreeCacheBuildContext, settings: Settings, resolver: NamespaceResolver, policies: dict[str, TenantPolicy]
) -> BasePrefixCache:
    """A hybrid linear-attention model, or a hybrid SWA model in SGLang's SWA sub-pool layout: SGLang's unified tree
    with its Mamba or SWA component, under the tenant rules.

    Raises:
        NotCoveredError: a recurrent-state tensor the state scrubber would not zero.
    """
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    from sglang_iso.integration.hybrid_cache import TenantHybridCache

    config = settings.tenants()
    # NOTE: SGLang's Python tree core: the namespace check walks its nodes (the Rust core keeps them opaque).
    ctx.params.tree_core_backend = TREE_CORE
    cache = create_unified_radix_cache(ctx, cache_class=TenantHybridCache)
    if type(cache.tree_core).__name__ != "UnifiedTreeCore":
        raise NotCoveredError(f"sglang-iso: hybrid SSM models on the {type(cache.tree_core).__name__} tree core")
    if not isinstance(cache, TenantHybridCache):  # SGLang chose another class (a platform override)
        raise NotCoveredError(f"sglang-iso: hybrid SSM models with SGLang's {type(cache).__name__}")
    cache.configure(resolver, policies)
    if config is not None:
        from sglang_iso.integration.fairness import KvShares

        cache.kv_shares = KvShares(config.kv_share_of)
    if settings.kv_scrub:
        from sglang_iso.integration.mamba_scrub import MambaScrubber
        from sglang_iso.integration.scrub import make_scrubber

        forward_stream = getattr(getattr(ctx.tp_worker, "model_runner", None), "forward_stream", None)
        cache.scrubber = make_scrubber(cache.token_to_kv_pool_allocator, cache.req_to_token_pool, forward_stream)
        if ctx.is_hybrid_ssm:
            cache.mamba_scrubber = MambaScrubber(cache.req_to_token_pool, forward_stream).install()
    if settings.kv_owner_check and not cache.disable:
        from sglang_iso.integration import owner_check

        cache.page_owners = owner_check.OwnerTable(cache).install()
    runtime.install(runtime.SchedulerRuntime(settings, cache, page_owners=cache.page_owners, pd_guard=None))  # type: ignore[arg-type]
    logger.info("sglang-iso: tenant hybrid cache built (namespace mode %s)", resolver.mode)
    return cache


def _attach_pd_guard(
    cache: TenantRadixCache, ctx: TreeCacheBuildContext, settings: Settings, secret: bytes | None
) -> None:
    """On a prefill/decode worker, put the transfer quarantine and tag check on the pool (outermost).

    Raises:
        NotCoveredError: PD without a tenants file (its secret keys the transfer tag), or the PD hooks
            were not applied in this process.
    """
    mode = str(getattr(ctx.server_args, "disaggregation_mode", None) or "null")
    if mode not in ("prefill", "decode") or cache.token_to_kv_pool_allocator is None:
        return
    if not secret:
        raise NotCoveredError("sglang-iso: --disaggregation-mode needs --tenants-file (its secret keys the tag)")
    from sglang_iso.integration import pd_transfer

    missing = hook_table.missing(required=hook_table.Required.PD)
    if missing:
        raise NotCoveredError(f"sglang-iso: PD transfer hooks were not applied: {missing}")
    guard = pd_transfer.PdGuard(cache.token_to_kv_pool_allocator, secret, mode, settings.pd_drain_timeout_s)
    cache.pd_guard = guard.install()


def _attach_host_tier(
    cache: TenantRadixCache, ctx: TreeCacheBuildContext, settings: Settings, secret: bytes | None
) -> None:
    """Give the tree a per-namespace host (L2) tier sized by ``--hicache-ratio`` / ``--hicache-size``, and the
    L3 file store when the launcher set its directory.

    Raises:
        NotCoveredError: L3 storage without a namespace secret, its directory cannot be created, or a
            malformed overall cap.
    """
    import math

    from sglang_iso.integration.host_cache import HostCache, host_capacity_tokens, l3_owner_of
    from sglang_iso.integration.l3_store import FileL3Store, model_fingerprint
    from sglang_iso.integration.scrub import kv_buffers

    server_args = ctx.server_args

    allocator = cache.token_to_kv_pool_allocator
    buffers = kv_buffers(allocator.get_kvcache())
    per_token = sum(b.element_size() * math.prod(b.shape[1:]) for b in buffers)
    capacity = host_capacity_tokens(server_args, int(allocator.size), per_token)
    cache.host = cache.token_to_kv_pool_host = HostCache(cache, capacity)
    cache.tree.set_spill(cache.host.spill)
    logger.info("sglang-iso: host tier attached (%d tokens, %d bytes per token)", capacity, per_token)
    directory = settings.l3_dir
    if not directory:
        return
    if not secret:
        raise NotCoveredError("sglang-iso: L3 storage needs --tenants-file (its namespace secret keys the store)")
    layout = f"page={cache.page_size};tp={ctx.tp_rank}/{ctx.tp_size};" + ";".join(
        f"{b.dtype}{tuple(b.shape[1:])}" for b in buffers
    )
    fingerprint = model_fingerprint(str(server_args.model_path), layout)
    resolver = cache.resolver
    try:
        cache.host.l3 = FileL3Store(
            directory,
            secret,
            fingerprint,
            cache.host.page_bytes,
            l3_owner_of(resolver),
            max_bytes=settings.l3_max_bytes,
        )
    except OSError as exc:
        raise NotCoveredError(f"sglang-iso: L3 storage directory {directory!r} is not usable: {exc}") from None
    except ValueError as exc:
        raise NotCoveredError(f"sglang-iso: L3 storage: {exc} (raise --iso-l3-max-gb)") from None
    for owner, policy in cache.policies.items():
        cache.host.set_l3_quota(owner, policy.l3_quota_tokens)
    logger.info(
        "sglang-iso: L3 file store attached (page files keyed by the namespace secret; %d indexed, cap %s pages)",
        len(cache.host.l3.index),
        cache.host.l3.index.max_pages,
    )


def _tenant_limits(config: Any) -> frozenset[str]:
    """The per-namespace limits a tenants file sets (:data:`coverage.TENANT_LIMIT_FIELDS`)."""
    if config is None:
        return frozenset()
    found = {f for f in coverage.TENANT_LIMIT_FIELDS[:-1] for t in config.tenants.values() if getattr(t, f) is not None}
    return frozenset(found | ({"shared_prefixes"} if config.shared_prefixes else set()))


def _server_tokenizer(server_args: Any) -> Any:
    """The tokenizer the server uses, loaded the same way SGLang loads it."""
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    return get_tokenizer(
        server_args.tokenizer_path or server_args.model_path,
        tokenizer_mode=server_args.tokenizer_mode,
        trust_remote_code=server_args.trust_remote_code,
        tokenizer_revision=getattr(server_args, "revision", None),
    )


def _has_attention_sinks(server_args: Any) -> bool:
    """Whether the served model's local ``config.json`` names an architecture with attention sinks."""
    from sglang_iso.server.cpu_pool import local_model_config

    model = getattr(server_args, "model_path", None)
    return coverage.is_attention_sink_config(local_model_config(["--model-path", str(model)]) if model else {})
