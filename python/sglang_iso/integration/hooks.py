"""The scheduler-process hooks of :mod:`sglang_iso.integration.hook_table` (tree cache check, /iso commands).

All of them run in the scheduler process. They never swallow errors: a failed
check stops the scheduler before it serves a request.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from sglang_iso.coverage import NotCoveredError
from sglang_iso.integration import commands
from sglang_iso.settings import current as current_settings

logger = logging.getLogger(__name__)

# Set by sglang-iso's launcher; inherited by every spawned SGLang process.


class UnhardenedCacheError(RuntimeError):
    """The scheduler's live tree cache is not sglang-iso's tenant cache."""


def tree_cache_status(tree_cache: object) -> dict[str, Any]:
    """Describe a tree cache; ``is_tenant`` is True only for ours (the tenant tree, or the hybrid one)."""
    from sglang_iso.integration.tenant_cache import TenantRadixCache

    if isinstance(tree_cache, TenantRadixCache):
        return {"is_tenant": True, **tree_cache.iso_status()}
    if type(tree_cache).__name__ == "TenantHybridCache":  # NOTE: by name: importing it imports SGLang's unified tree
        from sglang_iso.integration.hybrid_cache import TenantHybridCache

        if isinstance(tree_cache, TenantHybridCache):
            return {"is_tenant": True, **tree_cache.iso_status()}
    return {"is_tenant": False, "backend": None, "impl": type(tree_cache).__name__}


def refuse_uncovered_speculative(_scheduler: Any, server_args: Any, *_args: Any, **_kwargs: Any) -> None:
    """BEFORE ``Scheduler.__init__``: refuse what the coverage table's tree rows refuse from ``ServerArgs`` alone
    (an uncovered speculative algorithm, a draft model with the host tier, ...) before any model loads: a draft
    model of the wrong kind may fail to load before the tree cache factory could name the flag.

    Raises:
        NotCoveredError: the tenant tree is selected with a feature :mod:`sglang_iso.coverage` refuses.
    """
    if not current_settings().require_tenant_cache and getattr(server_args, "radix_cache_backend", None) != "tenant":
        return
    from sglang_iso import coverage

    features = coverage.Features.from_server_args(server_args, kv_owner_check=False, tenants_file=True)
    refused = coverage.refusals(features, group="tree")
    if refused:
        raise NotCoveredError(f"sglang-iso: {coverage.explain(refused)}")


def verify_scheduler_tree_cache(_result: None, scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``Scheduler.__init__``: refuse to serve with a tree cache that is not ours.

    Enforced only when sglang-iso's launcher started the server (``Settings.require_tenant_cache``),
    so a plain upstream server started from the same environment (the baseline of
    our benchmarks) keeps working.

    Raises:
        UnhardenedCacheError: the live ``scheduler.tree_cache`` is another class.
        NotCoveredError: a speculative draft model the scrubber and owner check would not cover.
    """
    status = tree_cache_status(getattr(scheduler, "tree_cache", None))
    if status["is_tenant"]:
        from sglang_iso.integration.spec_draft import attach_draft_pools

        attach_draft_pools(scheduler)  # a draft model's KV pool: scrubbed and zero-paged like the target's
    if not current_settings().require_tenant_cache:
        logger.info("sglang-iso: tree cache %s (not enforced in this process)", status["impl"])
        return
    if not status["is_tenant"]:
        raise UnhardenedCacheError(
            f"sglang-iso: the scheduler's tree cache is {status['impl']}, not the tenant cache; "
            "refusing to serve unhardened (was --radix-cache-backend overridden?)"
        )
    logger.info("sglang-iso: verified live tree cache: %s", status)


class _FrozenCount:
    """The permanent generation's size, once SGLang's freeze has filled it. ``gc.get_freeze_count()`` walks every
    frozen object: about 80 ms in a started scheduler (measured here), during which no forward runs for any tenant, on
    every status read (``/get_server_info``, ``GET /iso/tenants``). The freeze only adds objects (nothing here
    unfreezes), so the first non-zero count is kept; while it is 0 the walk is over an empty list."""

    seen = 0


def frozen_objects() -> int:
    """Objects SGLang's post-start freeze moved out of the collector's reach (0: not frozen yet)."""
    if not _FrozenCount.seen:
        _FrozenCount.seen = gc.get_freeze_count()
    return _FrozenCount.seen


def report_internal_state(result: Any, controller: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``get_internal_state``: add ``sglang_iso`` to /get_server_info's internal_states."""
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        tree_cache = controller.scheduler.tree_cache
        report: dict[str, Any] = {
            "tree_cache": tree_cache_status(tree_cache),
            "dp_rank": _dp_rank(),
            # NOTE: objects moved out of the collector's reach by SGLang's post-start freeze (0: not frozen, and
            # every full collection walks the whole start-up heap).
            "gc_frozen_objects": frozen_objects(),
        }
        if hasattr(tree_cache, "tenant_stats"):
            report["tenants"] = tree_cache.tenant_stats()
            report["erase_receipts"] = dict(tree_cache.erase_receipts)
        from sglang_iso.integration import spec_ngram

        ngram = spec_ngram.status(controller.scheduler)
        if ngram is not None:
            report["ngram"] = ngram
        from sglang_iso.integration import runtime

        guard = runtime.pd_guard()
        if guard is not None:
            report["pd"] = guard.status()
        state["sglang_iso"] = report


ERASE_RECEIPTS_KEPT = 64


def _erase(scheduler: Any, command: commands.Command) -> None:
    """Erase an owner's cache in this rank and keep the receipt for the HTTP process to read back."""
    from sglang_iso.integration.spec_ngram import flush_tenant

    tree_cache = scheduler.tree_cache
    owner, receipt_id = commands.erase_parts(command)
    receipt = {**tree_cache.erase_owner(owner), "ngram_corpora_dropped": flush_tenant(scheduler, owner)}
    receipts = tree_cache.erase_receipts
    receipts[receipt_id] = receipt
    while len(receipts) > ERASE_RECEIPTS_KEPT:
        receipts.pop(next(iter(receipts)))
    logger.warning("sglang-iso: erased the cache of %s: %s", owner, receipt)


def _dp_rank() -> int:
    """This scheduler's data-parallel rank (0 without DP); replies from ranks arrive in any order."""
    from sglang.srt.runtime_context import get_parallel

    rank = get_parallel().dp_rank
    return int(rank) if rank is not None else 0


def _pd_command(command: commands.Command) -> bool:
    from sglang_iso.integration import runtime

    guard = runtime.pd_guard()
    if guard is None:
        return False
    if command == commands.PD_RECLAIM:
        guard.reclaim()
    return True


def handle_iso_commands(original: Any, controller: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``set_internal_state``: run sglang-iso's commands (:mod:`~sglang_iso.integration.commands`) in the
    scheduler, pass any other request on. A request mixing ours with SGLang's keys is refused (``updated`` False)."""
    requested = getattr(recv_req, "server_args", None) or {}
    ours = [c for c in map(commands.parse, requested) if c is not None]
    if not ours:
        return original(controller, recv_req, *args, **kwargs)
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    tree_cache = controller.scheduler.tree_cache
    if len(ours) != len(requested) or not hasattr(tree_cache, "flush_owner"):
        return SetInternalStateReqOutput(updated=False)
    ok = True
    for command in ours:
        if command == commands.CHECK_INTEGRITY:
            ok = ok and tree_cache.check_integrity()
        elif command.kind == "flush_adapter":
            released = tree_cache.flush_adapter(command.argument)
            logger.info("sglang-iso: flushed adapter load %s (%d tokens released)", command.argument, released)
        elif command.kind in ("pd_status", "pd_reclaim"):
            ok = ok and _pd_command(command)
        elif command.kind == "erase":
            _erase(controller.scheduler, command)
        else:
            released = tree_cache.flush_owner(command.argument)
            from sglang_iso.integration.spec_ngram import flush_tenant

            flush_tenant(controller.scheduler, command.argument)  # and its NGRAM draft text, if any
            logger.warning("sglang-iso: flushed tenant %s (%d tokens released)", command.argument, released)
    return SetInternalStateReqOutput(updated=ok)
