"""Speculative decoding with a draft model (STANDALONE, EAGLE, EAGLE3, NEXTN) under the tenant tree.

SGLang's draft model shares the target's ``req_to_token`` rows and KV allocator:
a draft token's KV lives at the same slot index as the target's, in the draft
runner's own buffers. So the tree's namespaces already govern both pools (one
match hands out target and draft KV together; with an EAGLE-style head, whose
KV at a position also depends on the next token, the tree is keyed by token
pairs: ``cache/pair_keys.py``), and what is left is:

    scrub on free     the draft pool's buffers are added to the scrubber (same pages, same free path)
                      and the owner check's zero page is zeroed in them too
    owner check       the draft passes plan attention (``init_forward_metadata`` builds kv indices from
                      ``req_to_token``) BEFORE the checked ``ModelRunner.forward``; so every decode step is
                      sanitized at the speculative worker's entry, before the first draft plan:

        EAGLEWorkerV2.forward_batch_generation (decode)          <- check_before_spec_step: rows [0, seq + W)
          draft():         prepare_for_draft, init_forward_metadata, draft_runner.forward x steps
          verify():        eagle_prepare_for_verify, target forward (TARGET_VERIFY, checked again)
          draft extend:    prepare_for_draft_extend, init_forward_metadata, draft_runner.forward

    W = max(num_steps * topk, num_draft_tokens): every column this step's passes read or write past the
    committed ``seq`` tokens (allocated by the scheduler before the step, so they are adopted, never
    refused). Prefill steps need no entry check: the target's extend forward (checked) runs before the
    draft extend plans anything.

The draft runners must share the tree cache's row table and allocator; anything else (a compact draft
table, adaptive step counts, page size > 1 with top-k > 1, whose draft layout reaches past W, pipeline
parallelism and DP prefill coordination, which draft outside this step shape) is refused when the scheduler
starts (:func:`attach_draft_pools`). The checks at ``ModelRunner.forward`` still run for every draft and
verify forward (defense in depth: a row changed inside a step after the entry check is caught there and the
request aborted, although a draft pass planned before it may have read it once).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_iso.coverage import NotCoveredError

logger = logging.getLogger(__name__)


def check_before_spec_step(worker: Any, batch: Any, *_args: Any, **_kwargs: Any) -> None:
    """BEFORE ``EAGLEWorkerV2.forward_batch_generation``: sanitize each decode row's window before any draft
    pass builds attention indices from it."""
    from sglang_iso.integration import runtime

    table = runtime.owner_table()
    if table is None or batch is None:
        return
    mode = batch.forward_mode
    if mode.is_idle():
        return
    if mode.is_extend() or getattr(batch, "is_extend_in_batch", False):
        return  # prefill: the target's checked extend forward runs before the draft extend plans anything
    rows = batch.req_pool_indices
    if rows is None or rows.numel() == 0:
        return
    width = step_width(worker)
    seq_lens = batch.seq_lens
    cpu = getattr(batch, "seq_lens_cpu", None)
    # NOTE: on the host the sum is exact and free; on a device the host copy avoids a sync (the Triton
    # check only needs the total to be non-zero), and without one (no-sync scheduling) one sum is read back.
    host = seq_lens if seq_lens.device.type == "cpu" or cpu is None else cpu
    committed = int(host.sum())
    total = committed + width * int(rows.numel())
    table.check_window(rows, seq_lens + width, seq_lens, total, draft_step=True)


def step_width(worker: Any) -> int:
    """Columns past the committed tokens that one decode step's draft, verify and draft extend touch."""
    return max(int(worker.speculative_num_steps) * int(worker.topk), int(worker.speculative_num_draft_tokens))


def attach_draft_pools(scheduler: Any) -> int:
    """After ``Scheduler.__init__``: put each draft runner's KV buffers under the scrubber and the owner
    check's zero page; returns how many buffers were added (0 without a draft model).

    Raises:
        NotCoveredError: a draft runner has its own row table or allocator, a KV pool class outside the
            model-family table or with a tensor scrub-on-free does not zero, the hook is missing, or the
            worker uses adaptive steps or a page-size > 1 top-k > 1 draft layout.
    """
    from sglang_iso import coverage
    from sglang_iso.integration import hook_table
    from sglang_iso.integration.scrub import pool_tensors, uncovered_tensors

    cache = getattr(scheduler, "tree_cache", None)
    worker = getattr(scheduler, "draft_worker", None)
    runners_of = getattr(worker, "_draft_model_runners", None)
    runners = tuple(runners_of()) if callable(runners_of) else ()
    if cache is None or not runners or getattr(cache, "disable", True):
        return 0
    if cache.scrubber is None and cache.page_owners is None:
        return 0
    problems = []
    for target in hook_table.missing(group="spec-draft"):
        problems.append(f"hook {target} was not applied")
    if getattr(worker, "adaptive_controller", None) is not None:
        problems.append("adaptive speculative steps")
    if getattr(worker, "enable_dp_spec_prefill_coordination", False):
        problems.append("SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION (decode rows drafted inside a prefill step)")
    if int(getattr(getattr(scheduler, "server_args", None), "pp_size", 1) or 1) > 1:
        problems.append("pipeline parallelism (the next round is drafted past this step's checked window)")
    if int(cache.page_size) > 1 and int(getattr(worker, "topk", 1)) > 1:
        problems.append("--page-size > 1 with --speculative-eagle-topk > 1 (holey draft layout)")
    added = 0
    for runner in runners:
        if runner.req_to_token_pool is not cache.req_to_token_pool:
            problems.append(f"draft runner {type(runner).__name__} has its own req_to_token table")
        if runner.token_to_kv_pool_allocator is not cache.token_to_kv_pool_allocator:
            problems.append(f"draft runner {type(runner).__name__} has its own KV allocator")
        pool = runner.token_to_kv_pool
        if problems or pool is cache.token_to_kv_pool_allocator.get_kvcache():
            continue
        name = type(pool).__name__
        if name not in coverage.COVERED_POOLS:
            problems.append(f"draft KV pool class {name} (not in the model-family table)")
            continue
        unscrubbed = uncovered_tensors(pool)
        if unscrubbed:
            problems.append(f"draft KV pool tensors scrub-on-free does not zero ({', '.join(sorted(unscrubbed))})")
            continue
        tensors = pool_tensors(pool)
        if not tensors.slots:
            problems.append(f"draft KV pool {name} has no buffers the scrubber knows")
            continue
        if tensors.pages and int(getattr(pool, "page_size", 0)) != int(cache.page_size):
            problems.append(f"draft KV pool {name} keeps page-indexed tensors at another page size")
            continue
        if cache.scrubber is not None:
            cache.scrubber.add_pool(tensors)
        if cache.page_owners is not None:
            cache.page_owners.add_draft_pool(tensors)
        added += tensors.total()
    if problems:
        raise NotCoveredError(f"sglang-iso: speculative draft model not covered: {'; '.join(problems)}")
    logger.info("sglang-iso: draft KV pool under scrub/owner check (%d buffers, same slots as the target)", added)
    return added
