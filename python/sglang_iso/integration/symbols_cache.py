"""SGLang cache-API, pool and allocator symbols sglang-iso uses (merged into ``symbols.HOOKED_SYMBOLS``).

Plain ``(path, params, use)`` triples so this module imports nothing of ours.
"""

from __future__ import annotations

_BPC = "sglang.srt.mem_cache.base_prefix_cache"
_URC = "sglang.srt.mem_cache.unified_radix_cache"

CACHE_SYMBOLS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "sglang.srt.mem_cache.registry:register_radix_cache_backend",
        ("name", "factory"),
        "registers the 'tenant' tree cache backend",
    ),
    (
        "sglang.srt.mem_cache.registry:get_radix_cache_factory",
        ("name",),
        "idempotent registration across repeated plugin loads",
    ),
    (
        "sglang.srt.mem_cache.registry:TreeCacheBuildContext",
        ("server_args", "params", "is_hybrid_swa", "is_hybrid_ssm", "is_dsa", "enable_hierarchical_cache"),
        "the argument our factory receives",
    ),
    (
        "sglang.srt.mem_cache.cache_init_params:CacheInitParams",
        ("disable", "req_to_token_pool", "token_to_kv_pool_allocator", "page_size", "enable_metrics", "is_eagle"),
        "what the tenant cache is built from",
    ),
    (
        "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache.checkpoint",
        ("self", "req", "up_to"),
        "the scheduler inserts a request's KV through it",
    ),
    (
        "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache.dec_lock_ref",
        ("self", "node", "params"),
        "lock release signature",
    ),
    (
        "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache.lock",
        ("self", "node"),
        "inherited: wraps inc_lock_ref into a TreeLock",
    ),
    (
        "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache.free_kv_row",
        ("self", "kv", "ranges"),
        "inherited: request release frees the row's own slots through the allocator",
    ),
    (
        "sglang.srt.mem_cache.base_prefix_cache:MatchPrefixParams",
        ("key", "req"),
        "match_prefix argument",
    ),
    (
        "sglang.srt.mem_cache.base_prefix_cache:InsertParams",
        ("key", "value", "priority"),
        "insert argument",
    ),
    (
        "sglang.srt.mem_cache.base_prefix_cache:MatchResult",
        ("device_prefix_len", "last_device_node", "last_host_node", "best_match_node"),
        "match_prefix result",
    ),
    (
        "sglang.srt.mem_cache.radix_cache:RadixKey.__init__",
        ("self", "token_ids", "extra_key", "cache_salt"),
        "the key the scheduler matches with; its extra_key carries the namespace tag",
    ),
    (
        "sglang.srt.mem_cache.allocator.base:BaseTokenToKVPoolAllocator.free",
        ("self", "free_index"),
        "the single release path of tree slots",
    ),
    (
        "sglang.srt.mem_cache.memory_pool:ReqToTokenPool.alloc",
        ("self", "reqs"),
        "wrapped on the instance: records each row's owner",
    ),
    (
        "sglang.srt.mem_cache.memory_pool:ReqToTokenPool.free_rows",
        ("self", "indices"),
        "wrapped on the instance: rows reset to padding, owner cleared",
    ),
    (
        "sglang.srt.mem_cache.allocator.paged:PagedTokenToKVPoolAllocator._release_page_ids",
        ("self", "page_ids"),
        "wrapped on the instance: every paged free ends here (scrub, owner FREE)",
    ),
    (
        "sglang.srt.mem_cache.allocator.swa:SWATokenToKVPoolAllocator.__init__",
        ("self", "size", "size_swa", "page_size", "dtype", "device", "kvcache", "need_sort"),
        "an SWA hybrid allocator: full_attn_allocator and swa_attn_allocator, each scrubbed over its own sub-pool",
    ),
    (
        "sglang.srt.mem_cache.allocator.swa:SWATokenToKVPoolAllocator.free_swa_segment",
        ("self", "free_index", "start_pos"),
        "running requests' out-of-window frees: they end in swa_attn_allocator's release (scrubbed)",
    ),
    (
        "sglang.srt.mem_cache.swa_memory_pool:SWAKVPool.__init__",
        ("self", "size", "size_swa", "page_size", "swa_attention_layer_ids", "full_attention_layer_ids"),
        "its full_kv_pool and swa_kv_pool sub-pools are what the two scrubbers zero",
    ),
    (
        "sglang.srt.mem_cache.allocator.mamba:MambaSlotAllocator.free",
        ("self", "free_index"),
        "every recurrent-state slot release ends here: wrapped on the instance, slots zeroed before reuse",
    ),
    (
        "sglang.srt.mem_cache.allocator.mamba:MambaSlotAllocator.alloc",
        ("self", "need_size"),
        "wrapped on the instance: pending state slots zeroed first",
    ),
    (
        "sglang.srt.mem_cache.allocator.mamba:MambaSlotAllocator.alloc_group_begin",
        ("self", "num_reqs"),
        "wrapped on the instance: pending state slots zeroed first",
    ),
    (
        "sglang.srt.mem_cache.allocator.mamba:MambaSlotAllocator.clear",
        ("self",),
        "wrapped on the instance: every state slot zeroed",
    ),
    (
        "sglang.srt.mem_cache.memory_pool:MambaPool.clear_slots",
        ("self", "indices"),
        "zeroes a slot's convolution, temporal and registered side states",
    ),
    (
        "sglang.srt.mem_cache.registry:create_unified_radix_cache",
        ("ctx", "cache_class"),
        "builds the hybrid tenant cache (SGLang's unified tree with the model's components) as our subclass",
    ),
    (
        "sglang.srt.mem_cache.cache_init_params:CacheInitParams",
        ("tree_core_backend", "tree_components"),
        "the hybrid tenant cache runs on the Python tree core (its nodes are walked by the namespace check)",
    ),
    (
        f"{_URC}:UnifiedRadixCache.mamba_protected_size",
        ("self",),
        "overridden: the owner check's zero state slot counts as protected in SGLang's idle accounting",
    ),
    (
        "sglang.srt.mem_cache.memory_pool:HybridReqToTokenPool.alloc",
        ("self", "reqs"),
        "writes each row's state slot into req_index_to_mamba_index_mapping, which the state check adopts after it",
    ),
    (
        "sglang.srt.mem_cache.memory_pool:HybridReqToTokenPool.get_mamba_indices",
        ("self", "req_indices"),
        "what a forward reads a row's state slot from (req_index_to_mamba_index_mapping), checked before it",
    ),
    (
        "sglang.srt.mem_cache.memory_pool:HybridReqToTokenPool.translate_mamba_indices",
        ("self", "mamba_indices"),
        "slot ids to the physical ids clear_slots takes (the zero state slot is cleared through it)",
    ),
    (
        f"{_URC}:UnifiedRadixCache.insert",
        ("self", "params"),
        "overridden: only keys of a verified namespace insert",
    ),
    (
        f"{_URC}:UnifiedRadixCache.protected_size",
        ("self",),
        "overridden: the owner check's zero page counts as protected",
    ),
    (
        "sglang.srt.mem_cache.unified_cache.unified_tree_core:UnifiedTreeCore.match_prefix",
        ("self", "params"),
        "the walk the hybrid cache runs before its namespace check (it raises on a foreign key)",
    ),
    (
        f"{_URC}:UnifiedRadixCache._match_tree",
        ("self", "params"),
        "overridden: the walk, then the namespace check before the components' finalizers",
    ),
    (
        f"{_URC}:UnifiedRadixCache._finalize_match_result",
        ("self", "params", "result"),
        "the components' match finalizers (the Mamba component's copy-on-write source) after the namespace check",
    ),
    (
        f"{_URC}:UnifiedRadixCache._apply_cache_actions",
        ("self", "actions"),
        "applies the walk's actions (a split) as SGLang's own _match_tree does",
    ),
    (
        f"{_URC}:UnifiedRadixCache.checkpoint",
        ("self", "req", "up_to"),
        "overridden: only requests of a verified namespace insert",
    ),
    (
        f"{_URC}:UnifiedRadixCache._evict_device_leaf",
        ("self", "node_id", "tracker"),
        "an erase, and a namespace over its quota, evict the owner's leaves one by one (KV and state freed by "
        "SGLang's own path)",
    ),
    (
        f"{_URC}:UnifiedRadixCache.evict",
        ("self", "params"),
        "overridden: namespaces over their quota give back their excess first",
    ),
    (
        f"{_URC}:UnifiedRadixCache.evict_for_alloc",
        ("self", "params", "allocation_reclaim_satisfied"),
        "overridden: namespaces over their quota give back their excess first (keyword arguments passed on)",
    ),
    (
        f"{_URC}:UnifiedRadixCache.full_protected_size",
        ("self",),
        "overridden: the owner check's zero page counts as protected in SGLang's idle accounting",
    ),
    (
        "sglang.srt.mem_cache.unified_cache.unified_tree_core:UnifiedTreeCore.node_by_id",
        ("self", "node_id"),
        "the namespace check walks a match's nodes up to the root",
    ),
    (
        "sglang.srt.mem_cache.unified_cache.unified_tree_core:UnifiedTreeCore._is_device_leaf",
        ("self", "node"),
        "an erase and a quota evict only unlocked device leaves",
    ),
    (
        "sglang.srt.mem_cache.unified_cache.unified_tree_core:UnifiedTreeNode.__init__",
        ("self", "tree_components", "priority"),
        "nodes carry children, parent, the key (its extra_key and cache_salt are the namespace tag) and "
        "last_access_time (a quota evicts the least recently used leaf first)",
    ),
    (
        "sglang.srt.mem_cache.unified_cache.components.base:TreeComponent.cleanup_after_caching_req",
        ("self", "req", "is_finished"),
        "a request outside any namespace releases its component state as SGLang's disabled tree does",
    ),
    (
        f"{_URC}:UnifiedRadixCache.swa_protected_size",
        ("self",),
        "overridden: the owner check's sliding-window zero page counts as protected in SGLang's idle accounting",
    ),
    (
        "sglang.srt.mem_cache.allocator.swa:SWATokenToKVPoolAllocator.clear_full_to_swa_mapping",
        ("self", "full_indices"),
        "wrapped on the instance: the full zero page keeps its entries pointing at the sliding-window zero page",
    ),
    (
        "sglang.srt.mem_cache.allocator.swa:SWATokenToKVPoolAllocator.__init__",
        ("self", "size", "size_swa", "page_size"),
        "full_attn_allocator, swa_attn_allocator and full_to_swa_index_mapping: the owner check's two tables",
    ),
    (
        "sglang.srt.mem_cache.unified_cache.components:ComponentType",
        (),
        "ComponentType.SWA names the sliding-window eviction cursor of a request",
    ),
    (
        "sglang.srt.managers.schedule_batch:ReqKvInfo.get_evicted_seqlen",
        ("self", "component_type"),
        "a request's SWA eviction cursor: the sliding-window check starts no lower",
    ),
    (
        f"{_BPC}:BasePrefixCache.swa_retain_window",
        (),
        "the window SGLang keeps live behind a request: the sliding-window check reads no further back",
    ),
    (f"{_BPC}:EvictParams", ("num_tokens",), "evict argument"),
    (f"{_BPC}:EvictResult", ("num_tokens_evicted",), "evict result"),
    (f"{_BPC}:InsertResult", ("prefix_len",), "insert result"),
    (f"{_BPC}:IncLockRefResult", ("delta",), "inc_lock_ref result: evictable-size change"),
    (f"{_BPC}:DecLockRefParams", (), "dec_lock_ref argument (accepted, unused)"),
    (f"{_BPC}:DecLockRefResult", ("delta",), "dec_lock_ref result: evictable-size change"),
)
