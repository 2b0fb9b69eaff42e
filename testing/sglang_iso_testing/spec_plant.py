"""Test-only hooks for speculative decoding with a draft model (STANDALONE); part of :mod:`sglang_iso_testing.plant`.

Registered by ``plant.register()`` after sglang-iso's own hooks, so they run first:

``EAGLEWorkerV2.forward_batch_generation`` BEFORE
    decode step: plant an armed ``draft:<tenant>`` foreign slot before sglang-iso's entry check (which runs
    before any draft pass plans attention); prefill: count the prefix tokens whose draft KV was already in the
    draft pool (``draft_kv_reused_tokens``: draft KV a request reused instead of computing it).
``set_internal_state`` AROUND
    ``sglang_iso_testing.zero_draft:<tenant>`` zeroes the draft pool's copy of the tenant's pages (its target
    KV stays); ``sglang_iso_testing.free_pages_zero`` checks that every free page is zero in every KV pool,
    target and draft (``...:selftest`` first dirties one free page, which must then be found).

Counters appear with the plant's under ``internal_states[i]["sglang_iso_testing"]``.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_iso.identity.tags import tenant_of

logger = logging.getLogger(__name__)

ZERO_DRAFT = "sglang_iso_testing.zero_draft:"
FREE_PAGES_ZERO = "sglang_iso_testing.free_pages_zero"
FREE_STATE_ZERO = "sglang_iso_testing.free_state_zero"
COUNTERS: dict[str, int] = {
    "draft_kv_reused_tokens": 0,
    "free_pages_holding_data": 0,
    "free_state_slots_holding_data": 0,
}

_WORKER = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{_WORKER}.forward_batch_generation", before_spec_step, HookType.BEFORE)
    internal = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
    HookRegistry.register(f"{internal}.set_internal_state", commands, HookType.AROUND)


def before_spec_step(worker: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE the speculative worker's step (and before sglang-iso's entry check)."""
    from sglang_iso_testing.plant import _table, plant_rows

    table = _table()
    if table is None or batch is None or not table.draft_buffers or batch.forward_mode.is_idle():
        return
    rows = batch.req_pool_indices
    if rows is None or rows.numel() == 0:
        return
    req_to_token = table.cache.req_to_token_pool.req_to_token
    if batch.forward_mode.is_extend() or getattr(batch, "is_extend_in_batch", False):
        _count_reused_draft_kv(table, batch, req_to_token)
    else:
        plant_rows(table, rows.tolist(), req_to_token, "draft")


def commands(original: Any, controller: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``set_internal_state``: the draft-pool test commands (nothing else may be in the same request)."""
    requested = getattr(recv_req, "server_args", None) or {}
    ours = [k for k in requested if isinstance(k, str) and k.startswith((ZERO_DRAFT, FREE_PAGES_ZERO, FREE_STATE_ZERO))]
    if not ours:
        return original(controller, recv_req, *args, **kwargs)
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    from sglang_iso_testing.plant import _table

    table = _table()
    if len(ours) != len(requested) or table is None:
        return SetInternalStateReqOutput(updated=False)
    ok = True
    for key in ours:
        if key.startswith(ZERO_DRAFT):
            ok = ok and _zero_draft_pages_of(table, key[len(ZERO_DRAFT) :]) > 0
        else:
            selftest = key.endswith(":selftest")
            check = _free_state_holding_data if key.startswith(FREE_STATE_ZERO) else _free_pages_holding_data
            found = check(table, selftest=selftest)
            ok = ok and (found > 0 if selftest else found == 0)
    return SetInternalStateReqOutput(updated=ok)


def _count_reused_draft_kv(table: Any, batch: Any, req_to_token: Any) -> None:
    """Prefix slots of each prefill (matched in the tree, so not recomputed) whose draft KV is non-zero."""
    first = table.draft_buffers[0]
    prefix = list(getattr(batch, "prefix_lens", None) or [])
    for row, n in zip(batch.req_pool_indices.tolist(), prefix, strict=False):
        if int(n) > 0:
            slots = req_to_token[int(row), : int(n)].to(first.device).long()
            COUNTERS["draft_kv_reused_tokens"] += int((first[slots].reshape(int(n), -1) != 0).any(dim=1).sum())


def _zero_draft_pages_of(table: Any, tenant: str) -> int:
    """Zero the draft pool's copy of every page ``tenant`` owns, leaving the target's; returns the pages zeroed."""
    import torch

    from sglang_iso_kernels import scrub_pages

    slots = [slot for slot in _owner_slots(table) if tenant_of(table.namespace_of(slot)) == tenant]
    if not slots or not table.draft_buffers:
        return 0
    mine = torch.isin(table.page_owner, torch.tensor(slots, dtype=torch.int32, device=table.page_owner.device))
    pages = mine.nonzero().flatten().to(torch.int64)
    scrub_pages(table.draft_buffers, pages, table.page_size)
    logger.warning("sglang-iso: TEST zeroed the draft KV of %d pages of one tenant", int(pages.numel()))
    return int(pages.numel())


def _owner_slots(table: Any) -> list[int]:
    """Owner slots currently holding a page (one host read; test-only)."""
    import torch

    return [int(s) for s in torch.unique(table.page_owner).tolist() if s >= 0 and table.namespace_of(int(s))]


def _free_state_holding_data(table: Any, *, selftest: bool) -> int:
    """After zeroing every pending freed state slot, count free recurrent-state slots with a non-zero value in any
    state tensor (every layer's convolution windows and temporal state); -1 without a state pool."""
    import torch

    cache = table.cache
    pool = cache.req_to_token_pool
    if getattr(pool, "mamba_pool", None) is None:
        return -1
    scrubber = getattr(cache, "mamba_scrubber", None)
    if scrubber is not None:
        scrubber.flush()
    free = pool.mamba_allocator.free_slots.to(torch.int64)
    state = pool.mamba_pool.mamba_cache
    tensors = [*state.conv, state.temporal]  # each [layers, slots + 1, ...]
    if free.numel() == 0:
        return 0

    def count() -> int:
        dirty = torch.zeros(free.numel(), dtype=torch.bool, device=free.device)
        for start in range(0, free.numel(), 256):  # NOTE: in chunks: the state pool can be gigabytes
            chunk = free[start : start + 256]
            for t in tensors:
                dirty[start : start + 256] |= t[:, chunk].ne(0).flatten(2).any(dim=2).any(dim=0)
        return int(dirty.sum())

    if not selftest:
        COUNTERS["free_state_slots_holding_data"] = count()
        return COUNTERS["free_state_slots_holding_data"]
    found = []
    for t in tensors:  # each state tensor on its own: one dirtied slot of it must be found
        t[:, free[0]] = 1
        found.append(count())
        t[:, free[0]] = 0
    return min(found)


def _free_pages_holding_data(table: Any, *, selftest: bool) -> int:
    """After zeroing every pending freed page, count free pages with a non-zero byte in any KV buffer: of both
    sub-pools in SGLang's SWA sub-pool layout (the self-test dirties one free page of each in turn, and the count is
    the smallest found, so each sub-pool's check must find its page)."""
    cache = table.cache
    allocator = cache.token_to_kv_pool_allocator
    if cache.scrubber is not None:
        cache.scrubber.flush()
    if table.swa is not None:
        found = [_dirty_free_pages(table.kv_allocator, [], selftest), _dirty_free_pages(table.swa.sub, [], selftest)]
    else:
        found = [_dirty_free_pages(allocator, list(table.draft_buffers), selftest)]
    COUNTERS["free_pages_holding_data"] = min(found) if selftest else sum(found)
    return COUNTERS["free_pages_holding_data"]


def _dirty_free_pages(allocator: Any, draft: list[Any], selftest: bool) -> int:
    """Free pages of ``allocator`` with a non-zero byte in its pool's buffers (or ``draft``'s)."""
    import torch

    from sglang_iso.integration.scrub import kv_buffers

    if hasattr(allocator, "get_all_free_pages"):
        pages = allocator.get_all_free_pages()
    else:
        pages = torch.cat([allocator.free_pages, allocator.release_pages])
    buffers = kv_buffers(allocator.get_kvcache()) + draft
    size = int(allocator.page_size)
    pages = pages.to(torch.int64)
    if pages.numel() == 0:
        return 0
    slots = (pages[:, None] * size + torch.arange(size, device=pages.device)[None, :]).reshape(-1)
    target = draft[0] if draft else buffers[0]
    if selftest:
        target[slots[:size]] = 1
    dirty = torch.zeros(pages.numel(), dtype=torch.bool, device=pages.device)
    for buf in buffers:
        dirty |= buf[slots].reshape(pages.numel(), -1).ne(0).any(dim=1)
    if selftest:
        target[slots[:size]] = 0
    return int(dirty.sum())
