"""Every SGLang symbol sglang-iso depends on, with the parameters it relies on.

``test/integration/test_compat.py`` resolves each entry against the installed
SGLang and checks that the named parameters still exist, so a version bump that
renames or drops one fails the suite instead of silently disabling a defense.
"""

from __future__ import annotations

from typing import NamedTuple

from sglang_iso.integration.symbols_cache import CACHE_SYMBOLS
from sglang_iso.integration.symbols_pd import PD_SYMBOLS

PINNED_SGLANG_VERSION = "0.5.23"


class HookedSymbol(NamedTuple):
    """One SGLang symbol and how we use it."""

    path: str  # "module:qualname"
    params: tuple[str, ...]  # parameter names we pass or receive (empty for classes/constants)
    use: str  # why we need it


HOOKED_SYMBOLS: tuple[HookedSymbol, ...] = (
    HookedSymbol(
        "sglang.srt.managers.scheduler:Scheduler.__init__",
        ("self", "server_args"),
        "BEFORE hook: refuses an uncovered speculative algorithm; AFTER hook: verifies the live tree cache is ours",
    ),
    HookedSymbol(
        "sglang.srt.managers.scheduler_components.internal_state:SchedulerInternalStateController.get_internal_state",
        ("self", "recv_req"),
        "AFTER hook: reports the live tree cache in /get_server_info",
    ),
    HookedSymbol(
        "sglang.srt.managers.scheduler_components.internal_state:SchedulerInternalStateController.set_internal_state",
        ("self", "recv_req"),
        "AROUND hook: runs /iso/flush in the scheduler",
    ),
    HookedSymbol(
        "sglang.srt.managers.io_struct:SetInternalStateReq",
        ("server_args",),
        "carries /iso/flush to the scheduler",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin.get_internal_state",
        ("self",),
        "/iso/tenants reads the scheduler's per-tenant stats",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin.set_internal_state",
        ("self", "obj"),
        "/iso/flush sends the flush command",
    ),
    HookedSymbol(
        "sglang.srt.entrypoints.http_server:_setup_and_run_http_server",
        ("server_args", "tokenizer_manager"),
        "BEFORE hook: installs the tenant gate and /iso routes",
    ),
    HookedSymbol(
        "sglang.srt.entrypoints.http_server:_freeze_gc_after_server_warmup",
        ("server_args",),
        "AROUND hook: SGLang's post-start /freeze_gc call, made with the gate's internal key",
    ),
    HookedSymbol(
        "sglang.srt.arg_groups.serving_hook:ssl_verify_of",
        ("cfg",),
        "the post-start /freeze_gc call verifies TLS as SGLang's own call does",
    ),
    HookedSymbol(
        "sglang.srt.server_args:ServerArgs.url",
        ("self", "port"),
        "the post-start /freeze_gc call goes to the server's own address",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_manager:TokenizerManager.generate_request",
        ("self", "obj", "request"),
        "AROUND hook: overwrites extra_key with the server's namespace tag; BEFORE hook: sets routed_dp_rank",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_manager:TokenizerManager.update_weights_from_disk",
        ("self", "obj", "request"),
        "AROUND hook: new weights -> new namespaces, old entries flushed",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin.update_weights_from_tensor",
        ("self",),
        "AROUND hook: new weights -> new namespaces, old entries flushed",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin.update_weights_from_distributed",
        ("self",),
        "AROUND hook: new weights -> new namespaces, old entries flushed",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin.update_weights_from_ipc",
        ("self",),
        "AROUND hook: new weights -> new namespaces, old entries flushed",
    ),
    HookedSymbol(
        "sglang.srt.runtime_context:get_parallel",
        (),
        "the scheduler's DP rank (``.dp_rank``), reported so /iso/tenants lists rows in rank order",
    ),
    HookedSymbol(
        "sglang.srt.managers.io_struct:GenerateReqInput",
        ("routed_dp_rank",),
        "BEFORE hook on generate_request sets it to the tenant's stable DP rank",
    ),
    HookedSymbol(
        "sglang.srt.model_executor.model_runner:ModelRunner.forward",
        ("self", "forward_batch"),
        "BEFORE hook: page-ownership check of every row of the batch, for every attention backend",
    ),
    HookedSymbol(
        "sglang.srt.managers.scheduler:Scheduler.process_batch_result",
        ("self", "batch", "result"),
        "BEFORE hook: requests that hit an ownership violation finish as aborted",
    ),
    HookedSymbol(
        "sglang.srt.model_executor.forward_batch_info:ForwardBatch",
        (
            "req_pool_indices",
            "seq_lens",
            "seq_lens_sum",
            "seq_lens_cpu",
            "extend_prefix_lens",
            "extend_prefix_lens_cpu",
            "forward_mode",
        ),
        "what the owner check reads",
    ),
    HookedSymbol(
        "sglang.srt.managers.schedule_batch:FINISH_ABORT",
        ("message", "status_code", "err_type"),
        "how a violating request is finished",
    ),
    HookedSymbol(
        "sglang.srt.utils.hf_transformers.tokenizer:get_tokenizer",
        ("tokenizer_name", "tokenizer_mode", "trust_remote_code", "tokenizer_revision"),
        "tokenizes operator-declared shared prefixes in the scheduler",
    ),
    HookedSymbol(
        "sglang.srt.plugins.hook_registry:HookRegistry.register",
        ("target", "hook", "hook_type"),
        "installs our hooks",
    ),
    HookedSymbol(
        "sglang.srt.plugins.hook_registry:HookType",
        (),
        "BEFORE / AFTER / AROUND, the kinds of the hook table's rows",
    ),
    HookedSymbol(
        "sglang.srt.plugins.hook_registry:HookRegistry._patched",
        (),
        "the targets applied in this process; serving is refused when a required one is missing",
    ),
    HookedSymbol(
        "sglang.srt.entrypoints:http_server",
        (),
        "the gate reads its module-level FastAPI ``app`` to add middleware and the /iso routes",
    ),
    HookedSymbol(
        "sglang.srt.managers.io_struct:SetInternalStateReqOutput",
        ("updated",),
        "the reply to an sglang-iso set_internal_state command",
    ),
    HookedSymbol(
        "sglang.srt.utils:kill_process_tree",
        ("parent_pid", "include_parent"),
        "the launcher stops SGLang's children when the server exits",
    ),
    HookedSymbol(
        "sglang.srt.server_args:prepare_server_args",
        ("argv",),
        "the launcher parses SGLang flags with SGLang's own parser",
    ),
    HookedSymbol(
        "sglang.srt.server_args:ServerArgs.add_cli_args",
        ("parser",),
        "the launcher shows SGLang's flags next to ours",
    ),
    HookedSymbol(
        "sglang.launch_server:run_server",
        ("server_args",),
        "the launcher starts the unmodified SGLang server",
    ),
    HookedSymbol(
        "sglang.srt.managers.schedule_policy:SchedulePolicy.calc_priority",
        ("self", "waiting_queue", "running_batch"),
        "AFTER hook: the waiting queue is interleaved by tenant after SGLang's own ordering",
    ),
    HookedSymbol(
        "sglang.srt.managers.scheduler:Scheduler._get_new_batch_prefill_raw",
        ("self", "prefill_delayer_single_pass", "running_batch"),
        "AROUND hook: requests over their owner's KV share leave self.waiting_queue for one prefill pass "
        "(reads max_total_num_tokens, max_running_requests, chunked_req, tree_cache)",
    ),
    HookedSymbol(
        "sglang.srt.managers.schedule_batch:ScheduleBatch.retract_decode",
        ("self",),
        "AROUND hook: the batch's tree_cache shares and token_to_kv_pool_allocator.size for the retraction order",
    ),
    HookedSymbol(
        "sglang.srt.managers.schedule_batch:ScheduleBatch._get_decode_retraction_order",
        ("reqs",),
        "AFTER hook: requests of owners over their KV share are retracted first",
    ),
    HookedSymbol(
        "sglang.srt.managers.scheduler:Scheduler.handle_generate_request",
        ("self", "recv_req"),
        "AROUND hook: a request with unrunnable token ids or an admission error is aborted alone",
    ),
    HookedSymbol(
        "sglang.srt.managers.scheduler:Scheduler.send_abort_output",
        ("self", "abort_req", "req"),
        "answers a request the guard refuses through SGLang's abort path",
    ),
    HookedSymbol(
        "sglang.srt.managers.io_struct:AbortReq",
        ("rid", "abort_message", "finished_reason"),
        "the abort the guard sends",
    ),
    HookedSymbol(
        "sglang.srt.plugins:load_plugins",
        (),
        "the launcher loads plugins exactly as SGLang's own entry points do",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin.load_lora_adapter",
        ("self", "obj"),
        "AROUND: records the content hash of the adapter files a load read (obj.lora_name, obj.lora_path)",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin.load_lora_adapter_from_tensors",
        ("self", "obj"),
        "AROUND: records the content hash of an adapter sent as tensors (obj.config_dict, serialized_named_tensors)",
    ),
    HookedSymbol(
        "sglang.srt.managers.io_struct:LoadLoRAAdapterFromTensorsReqInput",
        (),
        "its lora_name, config_dict and serialized_named_tensors are hashed into the adapter's identity",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_control_mixin:TokenizerControlMixin.unload_lora_adapter",
        ("self", "obj"),
        "AROUND: drops the name from TokenizerManager.lora_ref_cache so SGLang cannot silently reload it",
    ),
    HookedSymbol(
        "sglang.srt.managers.tokenizer_manager:TokenizerManager.init_lora",
        ("self",),
        "creates lora_ref_cache (name -> LoRARef), read to refuse unloaded adapters and find their files",
    ),
    HookedSymbol(
        "sglang.srt.lora.lora_registry:LoRARef",
        ("lora_id", "lora_name", "lora_path"),
        "the loaded adapter record: its per-load id is what SGLang appends to extra_key",
    ),
    HookedSymbol(
        "sglang.srt.managers.schedule_batch:Req.__init__",
        ("extra_key", "cache_salt", "lora_id"),
        "extra_key = (extra_key or '') + lora_id: the LoRA suffix the namespace resolver accepts after a tag",
    ),
    HookedSymbol(
        "sglang.srt.managers.io_struct:GenerateReqInput",
        ("lora_path", "lora_id", "extra_key"),
        "the front end overwrites extra_key and lora_id and checks lora_path",
    ),
    HookedSymbol(
        "sglang.srt.speculative.ngram_worker:NGRAMWorker.__init__",
        ("self", "server_args", "gpu_id", "nccl_port", "target_worker"),
        "AFTER: replaces self.ngram_corpus (one corpus for the server) by per-namespace corpora",
    ),
    HookedSymbol(
        "sglang.srt.speculative.ngram_worker:NGRAMWorker._prepare_draft_tokens",
        ("self", "batch"),
        "AROUND: binds batch.reqs' namespaces while it calls ngram_corpus.synchronize/batch_get",
    ),
    HookedSymbol(
        "sglang.srt.speculative.ngram_worker:NGRAMWorker._update_ngram_corpus",
        ("self", "batch"),
        "AROUND: binds batch.reqs' namespaces while it calls ngram_corpus.batch_put (one list per req)",
    ),
    HookedSymbol(
        "sglang.srt.speculative.cpp_ngram.ngram_corpus:NgramCorpus.__init__",
        ("capacity", "max_trie_depth", "min_bfs_breadth", "max_bfs_breadth", "draft_token_num", "match_type"),
        "one corpus per namespace, built with the server's --speculative-ngram-* settings",
    ),
    HookedSymbol(
        "sglang.srt.speculative.cpp_ngram.ngram_corpus:NgramCorpus.batch_get",
        ("self", "req_ids", "batch_tokens", "total_lens"),
        "called per namespace group; returns flat drafts [bs*n] and masks [bs*n*n]",
    ),
    HookedSymbol(
        "sglang.srt.speculative.cpp_ngram.ngram_corpus:NgramCorpus.batch_put",
        ("self", "batch_tokens"),
        "called per namespace group",
    ),
    HookedSymbol(
        "sglang.srt.speculative.cpp_ngram.ngram_corpus:NgramCorpus.erase_match_state",
        ("self", "req_ids"),
        "departed requests' match state, forwarded to every namespace corpus",
    ),
    HookedSymbol(
        "sglang.srt.runtime_context:get_spec",
        (),
        "the --speculative-ngram-* settings (speculative_ngram_capacity, ..._external_corpus_path, ...)",
    ),
    HookedSymbol(
        "sglang.srt.model_executor.forward_batch_info:ForwardMode.is_target_verify",
        ("self",),
        "the owner check widens its window by spec_info.draft_token_num on a verify forward",
    ),
    HookedSymbol(
        "sglang.srt.model_executor.forward_batch_info:ForwardMode.is_extend",
        ("self", "include_draft_extend_v2"),
        "the owner check's write start: the extend prefix lengths (extend_prefix_lens_cpu on the host route)",
    ),
    HookedSymbol(
        "sglang.srt.model_executor.forward_batch_info:ForwardMode.is_decode",
        ("self",),
        "the owner check's host route: a decode step writes each row's last column",
    ),
    HookedSymbol(
        "sglang.kernels.ops.speculative.reconstruct_tree:reconstruct_indices_from_tree_mask_func",
        ("tree_mask", "verified_seq_len", "positions", "batch_size", "draft_token_num"),
        "calls sgl_kernel.speculative.reconstruct_indices_from_tree_mask on CPU (platform/spec_cpu.py)",
    ),
    HookedSymbol(
        "sglang.srt.lora.backend.torch_backend:TorchNativeLoRABackend",
        (),
        "the CPU LoRA backend the launcher selects; its module is unpinned by platform/lora_cpu.py",
    ),
    # Model families (coverage.FAMILIES; platform/mla_cpu.py).
    HookedSymbol(
        "sglang.srt.models.deepseek_common.attention_backend_handler:AttentionBackendRegistry.register",
        ("backend_name", "handler_func"),
        "platform/mla_cpu.py registers torch_native with the absorbed MLA path on CPU",
    ),
    HookedSymbol(
        "sglang.srt.models.deepseek_common.attention_backend_handler:_dispatch_mla_subtype",
        ("attn", "forward_batch"),
        "the absorbed MLA method the CPU torch_native handler returns",
    ),
    HookedSymbol(
        "sglang.srt.configs.model_config:is_deepseek_dsa",
        ("config",),
        "coverage.DSA_ARCHITECTURES mirrors it so the launcher refuses DSA models before SGLang starts",
    ),
    *(
        HookedSymbol(
            f"sglang.srt.mem_cache.memory_pool:{pool}",
            (),
            "a KV pool class the tenant cache serves with (coverage.FAMILIES); integration/scrub.py zeroes its buffers",
        )
        for pool in (
            "MHATokenToKVPool",
            "MHATokenToKVPoolFP4",
            "MHATokenToKVPoolMXFP8",
            "MLATokenToKVPool",
            "MLATokenToKVPoolFP4",
            "DSATokenToKVPool",
        )
    ),
    HookedSymbol(
        "sglang.srt.mem_cache.memory_pool:DSATokenToKVPool.__init__",
        (
            "self",
            "size",
            "page_size",
            "index_buf_size",
            "index_kpool",
            "index_kpool_compress",
            "max_running_requests",
            "skip_topk_layers",
            "dcp_replicated",
        ),
        "integration/scrub.py zeroes index_key_cache.buffer by page and _compress_tail_k/_score by request row",
    ),
    HookedSymbol(
        "sglang.srt.mem_cache.index_key_cache:IndexKeyCache.__init__",
        ("self", "pool", "index_buf_size"),
        "one [pages, bytes] buffer per layer (0 rows for a shared-top-k layer): the page rows scrub-on-free zeroes",
    ),
    # Host (L2) tier, --enable-hierarchical-cache (integration/host_cache.py).
    HookedSymbol(
        "sglang.srt.server_args:ServerArgs",
        ("enable_hierarchical_cache", "hicache_ratio", "hicache_size", "hicache_storage_backend"),
        "sizes the host tier; L3 storage is refused",
    ),
    HookedSymbol(
        "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache.check_hicache_events",
        ("self",),
        "called each scheduler step with HiCache on; a no-op for the synchronous host tier",
    ),
    HookedSymbol(
        "sglang.srt.mem_cache.base_prefix_cache:BasePrefixCache.ready_to_load_host_cache",
        ("self",),
        "called per prefill batch with HiCache on; -1 (no asynchronous load-back)",
    ),
    HookedSymbol(
        "sglang.srt.mem_cache.pool_host.mha:MHATokenToKVPoolHost.__init__",
        ("self", "pin_memory"),
        "upstream HiCache on CPU (benchmark baseline): platform/hicache_cpu.py forces pin_memory=False and adds "
        "the module's transfer_kv_direct",
    ),
    HookedSymbol(
        "sglang.srt.managers.scheduler_components.metrics_reporter:SchedulerMetricsReporter._log_hicache_stats",
        ("self",),
        "with --enable-metrics reads tree_cache.token_to_kv_pool_host.logical_size and available_size()",
    ),
    HookedSymbol(
        "sglang.srt.managers.scheduler:Scheduler.clear_hicache_storage_wrapped",
        ("self", "recv_req"),
        "calls tree_cache.clear_storage_backend(): L3 pages become unreachable",
    ),
    HookedSymbol(
        "sglang.srt.mem_cache.allocator.base:BaseTokenToKVPoolAllocator.alloc",
        ("self", "need_size"),
        "device slots for pages loaded back from the host",
    ),
    HookedSymbol(
        "sglang.srt.mem_cache.allocator.base:BaseTokenToKVPoolAllocator.available_size",
        ("self",),
        "evict before a host load-back only when the pool is short",
    ),
    # Draft-model speculative decoding, STANDALONE (integration/spec_draft.py).
    HookedSymbol(
        "sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2.forward_batch_generation",
        ("self", "batch"),
        "BEFORE: a decode step's rows [0, seq + W) are sanitized before draft() plans attention",
    ),
    HookedSymbol(
        "sglang.srt.speculative.standalone_worker_v2:StandaloneWorkerV2.__init__",
        ("self", "server_args", "gpu_id", "nccl_port", "target_worker"),
        "sets speculative_num_steps, topk, speculative_num_draft_tokens (W = max(steps * topk, draft tokens)) "
        "and adaptive_controller (refused when set); test_compat reads them in its source",
    ),
    HookedSymbol(
        "sglang.srt.model_executor.model_runner:ModelRunner.__init__",
        ("self", "is_draft_worker"),
        "stored as model_runner.is_draft_worker: the forward check names a draft model's forwards (test plant)",
    ),
    HookedSymbol(
        "sglang.srt.server_args:ServerArgs",
        ("pp_size", "speculative_algorithm"),
        "a draft model with pipeline parallelism is refused (the next round is drafted past the checked window)",
    ),
    HookedSymbol(
        "sglang.srt.speculative.base_spec_worker:BaseSpecWorker._draft_model_runners",
        ("self",),
        "the draft runners whose token_to_kv_pool buffers are scrubbed; req_to_token_pool and "
        "token_to_kv_pool_allocator must be the tree cache's",
    ),
    HookedSymbol(
        "sglang.srt.speculative.eagle_worker_v2:EagleDraftWorker.draft",
        ("self", "batch"),
        "not hooked: calls init_forward_metadata before draft_runner.forward (why the check sits at the entry)",
    ),
    HookedSymbol(
        "sglang.srt.speculative.eagle_worker_common:prepare_for_draft_extend",
        ("draft_extend_input", "batch", "num_draft_tokens", "draft_model_runner"),
        "not hooked: plans the draft extend's attention from rows [0, seq + num_draft_tokens)",
    ),
    HookedSymbol(
        "sglang.srt.speculative.eagle_worker_common:prepare_for_draft",
        ("draft_input", "req_to_token_pool", "batch", "topk", "num_steps"),
        "not hooked: reads the draft write slots from rows [seq, seq + steps * topk)",
    ),
    HookedSymbol(
        "sglang.srt.mem_cache.allocation_sizing:page_aligned_decode_alloc_lens",
        ("reqs", "reserve", "page_size"),
        "not hooked: reserves committed + 2 * alloc_len per decode, so [seq, seq + W) is allocated before a step",
    ),
    HookedSymbol(
        "sglang.srt.layers.attention.mamba.mamba:MambaMixer2.forward",
        ("self", "hidden_states", "output", "layer_cache", "metadata", "use_triton_causal_conv"),
        "CPU only (platform/mamba2_cpu.py): calls its module's causal_conv1d_fn/_update (and _triton twins), "
        "mamba_chunk_scan_combined and selective_state_update, which the shim binds to torch stand-ins",
    ),
    HookedSymbol(
        "sglang.kernels.ops.mamba.triton_ops.ssd_combined:mamba_chunk_scan_combined",
        (
            "x",
            "dt",
            "A",
            "B",
            "C",
            "chunk_size",
            "D",
            "z",
            "dt_bias",
            "initial_states",
            "cu_seqlens",
            "dt_softplus",
            "dt_limit",
            "out",
            "return_final_states",
            "return_varlen_states",
            "return_intermediate_states",
            "state_dtype",
            "return_track_states",
            "track_seq_idx",
            "track_end_locs",
        ),
        "CPU only: the contract of mamba2_cpu.mamba_chunk_scan_combined_cpu (the kernel tests' oracle)",
    ),
    HookedSymbol(
        "sglang.kernels.ops.mamba.triton_ops.mamba_ssm:selective_state_update",
        (
            "state",
            "x",
            "dt",
            "A",
            "B",
            "C",
            "D",
            "z",
            "dt_bias",
            "dt_softplus",
            "state_batch_indices",
            "pad_slot_id",
            "out",
            "disable_state_update",
            "intermediate_states_buffer",
        ),
        "CPU only: the contract of mamba2_cpu.selective_state_update_cpu",
    ),
    HookedSymbol(
        "sglang.srt.models.qwen2_moe:Qwen2MoeSparseMoeBlock.forward",
        ("self", "hidden_states", "forward_batch"),
        "CPU only (platform/moe_gate_cpu.py): gates the shared expert with its module's fused_gate_sigmoid_mul(_add), "
        "which the shim binds to torch",
    ),
    HookedSymbol(
        "sglang.kernels.ops.elementwise.elementwise:fused_gate_sigmoid_mul",
        ("hidden_states", "gate_weight", "shared_output"),
        "CPU only: the contract of moe_gate_cpu.gate_sigmoid_mul_cpu (the kernel tests' oracle)",
    ),
    HookedSymbol(
        "sglang.kernels.ops.elementwise.elementwise:fused_gate_sigmoid_mul_add",
        ("hidden_states", "gate_weight", "shared_output", "final_hidden_states"),
        "CPU only: the contract of moe_gate_cpu.gate_sigmoid_mul_add_cpu",
    ),
)

HOOKED_SYMBOLS += tuple(HookedSymbol(*entry) for entry in (*CACHE_SYMBOLS, *PD_SYMBOLS))
