"""Every hook sglang-iso registers with SGLang's ``HookRegistry``, as one table.

The plugin registers from :data:`HOOKS` (:func:`install`), in table order; the startup checks ask
:func:`missing` which rows a serving process needs and were not applied; ``test/integration/test_compat.py``
resolves every target in the pinned SGLang and binds each hook to the target's signature.

Hooks are named as ``"module:function"`` strings and imported only when registered, so this module imports
nothing of ours and every module may read it. Test plugins (``sglang_iso_testing``) register their own hooks.

    row order matters per target: HookRegistry chains a target's hooks in registration order
    (``TokenizerManager.generate_request``: the tagging AROUND, then the DP routing BEFORE)
"""

from __future__ import annotations

import enum
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from sglang.srt.plugins.hook_registry import HookRegistry, HookType


class Required(enum.Enum):
    """When serving is refused if a row's target was not applied in the process."""

    SCHEDULER = "every scheduler with the tenant cache (the cache factory refuses)"
    TENANTS_FILE = "the HTTP process when the launcher passed a tenants file (the launcher refuses)"
    PD = "a prefill/decode worker's scheduler (the cache factory refuses)"


class Hook(NamedTuple):
    """One registration."""

    target: str
    """Dotted path as ``HookRegistry`` expects (``module.Class.method``)."""
    kind: HookType
    hook: str
    """Our hook function, ``"module:function"``; imported when registered."""
    group: str
    """What it defends (one group per concern; see :data:`GROUPS`)."""
    required: Required
    """Where a missing target stops the server."""


GROUPS = {
    "scheduler": "tree cache verification, /iso commands, request guard, fairness and KV shares",
    "owner-check": "page ownership check before every forward",
    "ngram": "one NGRAM draft corpus per namespace",
    "spec-draft": "draft-model rows sanitized before any draft pass plans attention",
    "front": "tenant gate, namespace tag, weight updates",
    "lora": "adapter identities and unloads",
    "dp": "tenant-stable data-parallel rank",
    "pd": "prefill/decode quarantine and transfer tag",
}

_I = "sglang_iso.integration"
_SCHED = "sglang.srt.managers.scheduler.Scheduler"
_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
_STATE = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
_NGRAM = "sglang.srt.speculative.ngram_worker.NGRAMWorker"
_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_MIXIN = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin"
_PREFILL = "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin"
_DECODE_PREALLOC = "sglang.srt.disaggregation.decode.DecodePreallocQueue"
_DECODE_TRANSFER = "sglang.srt.disaggregation.decode.DecodeTransferQueue"
_BEFORE, _AFTER, _AROUND = HookType.BEFORE, HookType.AFTER, HookType.AROUND
_S, _T, _P = Required.SCHEDULER, Required.TENANTS_FILE, Required.PD

HOOKS: tuple[Hook, ...] = (
    # Scheduler process.
    Hook(f"{_SCHED}.__init__", _BEFORE, f"{_I}.hooks:refuse_uncovered_speculative", "scheduler", _S),
    Hook(f"{_SCHED}.__init__", _AFTER, f"{_I}.hooks:verify_scheduler_tree_cache", "scheduler", _S),
    Hook(f"{_STATE}.get_internal_state", _AFTER, f"{_I}.hooks:report_internal_state", "scheduler", _S),
    Hook(f"{_STATE}.set_internal_state", _AROUND, f"{_I}.hooks:handle_iso_commands", "scheduler", _S),
    Hook(f"{_SCHED}.handle_generate_request", _AROUND, f"{_I}.request_guard:guard_generate_request", "scheduler", _S),
    Hook(
        "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority",
        _AFTER,
        f"{_I}.fairness:reorder_waiting_queue",
        "scheduler",
        _S,
    ),
    Hook(f"{_SCHED}._get_new_batch_prefill_raw", _AROUND, f"{_I}.fairness:admit_within_share", "scheduler", _S),
    Hook(f"{_BATCH}.retract_decode", _AROUND, f"{_I}.fairness:retract_with_shares", "scheduler", _S),
    Hook(f"{_BATCH}._get_decode_retraction_order", _AFTER, f"{_I}.fairness:retraction_order", "scheduler", _S),
    Hook(
        "sglang.srt.model_executor.model_runner.ModelRunner.forward",
        _BEFORE,
        f"{_I}.owner_check:check_before_forward",
        "owner-check",
        _S,
    ),
    Hook(f"{_SCHED}.process_batch_result", _BEFORE, f"{_I}.owner_check:abort_before_results", "owner-check", _S),
    Hook(f"{_NGRAM}.__init__", _AFTER, f"{_I}.spec_ngram:partition_corpus", "ngram", _S),
    Hook(f"{_NGRAM}._prepare_draft_tokens", _AROUND, f"{_I}.spec_ngram:bind_batch", "ngram", _S),
    Hook(f"{_NGRAM}._update_ngram_corpus", _AROUND, f"{_I}.spec_ngram:bind_batch", "ngram", _S),
    Hook(
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
        _BEFORE,
        f"{_I}.spec_draft:check_before_spec_step",
        "spec-draft",
        _S,
    ),
    Hook(f"{_PREFILL}.send_kv_chunk", _AFTER, f"{_I}.pd_transfer:after_send_kv_chunk", "pd", _P),
    Hook(
        f"{_PREFILL}.process_disagg_prefill_inflight_queue",
        _AFTER,
        f"{_I}.pd_transfer:after_prefill_inflight",
        "pd",
        _P,
    ),
    Hook(f"{_PREFILL}.handle_inflight_transfer_failure", _BEFORE, f"{_I}.pd_transfer:before_prefill_failure", "pd", _P),
    Hook(f"{_PREFILL}._retire_aborted_prefill_result", _BEFORE, f"{_I}.pd_transfer:before_prefill_abort", "pd", _P),
    Hook(
        "sglang.srt.disaggregation.utils.MetadataBuffers.set_buf", _AFTER, f"{_I}.pd_transfer:after_set_buf", "pd", _P
    ),
    Hook(f"{_DECODE_PREALLOC}._send_kv_metadata", _AFTER, f"{_I}.pd_transfer:after_send_kv_metadata", "pd", _P),
    Hook(f"{_DECODE_TRANSFER}._commit_transfer_to_req", _AROUND, f"{_I}.pd_transfer:around_commit", "pd", _P),
    Hook(f"{_DECODE_TRANSFER}._abort_failed_transfer", _BEFORE, f"{_I}.pd_transfer:before_decode_failure", "pd", _P),
    Hook(f"{_DECODE_TRANSFER}._do_release", _BEFORE, f"{_I}.pd_transfer:before_do_release", "pd", _P),
    Hook(f"{_DECODE_TRANSFER}.pop_transferred", _AFTER, f"{_I}.pd_transfer:after_pop_transferred", "pd", _P),
    # HTTP / tokenizer-manager process (they act only there; registered in every process).
    Hook(
        "sglang.srt.entrypoints.http_server._setup_and_run_http_server",
        _BEFORE,
        f"{_I}.front.install:install_gate",
        "front",
        _T,
    ),
    Hook(
        "sglang.srt.entrypoints.http_server._freeze_gc_after_server_warmup",
        _AROUND,
        f"{_I}.front.gc_freeze:freeze_gc_through_gate",
        "front",
        _T,
    ),
    Hook(f"{_TM}.generate_request", _AROUND, f"{_I}.front.request_tags:tag_and_observe", "front", _T),
    Hook(f"{_TM}.update_weights_from_disk", _AROUND, f"{_I}.front.weights:after_weight_update", "front", _T),
    Hook(f"{_MIXIN}.update_weights_from_tensor", _AROUND, f"{_I}.front.weights:after_weight_update", "front", _T),
    Hook(f"{_MIXIN}.update_weights_from_distributed", _AROUND, f"{_I}.front.weights:after_weight_update", "front", _T),
    Hook(f"{_MIXIN}.update_weights_from_ipc", _AROUND, f"{_I}.front.weights:after_weight_update", "front", _T),
    Hook(f"{_MIXIN}.load_lora_adapter", _AROUND, f"{_I}.lora:after_load", "lora", _T),
    Hook(f"{_MIXIN}.load_lora_adapter_from_tensors", _AROUND, f"{_I}.lora:after_tensor_load", "lora", _T),
    Hook(f"{_MIXIN}.unload_lora_adapter", _AROUND, f"{_I}.lora:after_unload", "lora", _T),
    Hook(f"{_TM}.generate_request", _BEFORE, f"{_I}.dp_routing:route_to_tenant_rank", "dp", _T),
)


def install(hooks: Iterable[Hook] = HOOKS) -> None:
    """Register ``hooks`` with SGLang's ``HookRegistry``, in order (applied later by ``load_plugins``)."""
    for row in hooks:
        HookRegistry.register(row.target, resolve_hook(row), row.kind)


def resolve_hook(row: Hook) -> Callable[..., Any]:
    """Import a row's hook function.

    Raises:
        ImportError, AttributeError: the row names a function that does not exist.
    """
    fn: Callable[..., Any] = pkgutil.resolve_name(row.hook)
    return fn


def targets(*, required: Required | None = None, group: str | None = None) -> tuple[str, ...]:
    """The distinct targets of the rows matching ``required`` and ``group`` (None: any), in table order."""
    rows = (h for h in HOOKS if required in (None, h.required) and group in (None, h.group))
    return tuple(dict.fromkeys(h.target for h in rows))


def missing(*, required: Required | None = None, group: str | None = None) -> list[str]:
    """Those :func:`targets` that ``HookRegistry`` has not applied in this process."""
    return [t for t in targets(required=required, group=group) if t not in HookRegistry._patched]
