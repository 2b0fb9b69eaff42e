"""Test-only server plugin: plant a foreign KV slot into a request's row, to prove the owner check refuses it.

Loaded in every SGLang process through ``SGLANG_ISO_TEST_PLUGINS=sglang_iso_testing.plant`` together
with ``SGLANG_ISO_TESTING=1`` (:func:`plant_env`); the launcher refuses to start with the first
without the second. It changes nothing until armed by an admin command:

    POST /set_internal_state {"server_args": {"sglang_iso_testing.plant:<tenant>": 1}}

The next forward of a request of ``<tenant>`` (``verify:<tenant>``: its next speculative verify
forward; ``draft_forward:<tenant>``: its next forward of a draft model; ``draft:<tenant>``: its next
speculative decode step, before the draft plans attention, see :mod:`sglang_iso_testing.spec_plant`;
``state:<tenant>``: its next forward on a hybrid linear-attention model, whose recurrent-state slot is pointed at
another namespace's tree snapshot; ``swa:<tenant>``: its next forward in SGLang's SWA sub-pool layout, whose first
column's sliding-window map entry is pointed at another owner's sliding-window page)
gets, at position 0 of its ``req_to_token`` row, one slot of a page another owner holds.
The owner check must redirect it to the zero page and abort the request; before the abort this plugin
records whether the redirected slot reads the all-zero page and gives the row its own slot back.
Counters appear in /get_server_info under ``internal_states[i]["sglang_iso_testing"]``.

Hooks (registered after sglang-iso's, so they wrap them and run first):
``ModelRunner.forward`` BEFORE (plant, then the owner check runs), ``Scheduler.process_batch_result``
BEFORE (read back and restore, then the owner check aborts), ``set_internal_state`` AROUND (arm),
``get_internal_state`` AFTER (counters).
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_iso import envvars
from sglang_iso.identity.tags import tenant_of

logger = logging.getLogger(__name__)

COMMAND = "sglang_iso_testing.plant:"


def plant_env() -> dict[str, str]:
    """Environment for a server that loads this plugin (test harness only)."""

    return {envvars.TESTING.name: "1", envvars.TEST_PLUGINS.name: __name__}


class _PlantState:
    """What is armed and what was planted, in this scheduler process. Scheduler thread only."""

    def __init__(self) -> None:
        self.armed: set[str] = set()  # "<tenant>", or "<pass>:<tenant>" (verify, draft, draft_forward)
        self.planted: dict[int, list[tuple[int, int]]] = {}  # row -> (position, original slot)
        self.planted_count = 0
        self.planted_read_zero = 0  # planted slots found redirected to the (all-zero) zero page
        self.planted_state: dict[int, int] = {}  # row -> its own recurrent-state slot, while a foreign one is planted
        self.planted_state_redirected = 0  # planted state slots found replaced by the zero state slot
        self.planted_swa: dict[int, tuple[int, int]] = {}  # row -> (its full slot, that slot's own SWA slot)
        self.planted_swa_redirected = 0  # planted map entries found pointed at the sliding-window zero page


_STATE = _PlantState()


def register() -> None:
    """Register the hooks (called by sglang-iso's plugin in every SGLang process)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.model_executor.model_runner.ModelRunner.forward", plant_before_forward, HookType.BEFORE
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.process_batch_result", restore_before_results, HookType.BEFORE
    )
    internal = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
    HookRegistry.register(f"{internal}.set_internal_state", arm, HookType.AROUND)
    HookRegistry.register(f"{internal}.get_internal_state", report, HookType.AFTER)
    from sglang_iso_testing import spec_plant

    spec_plant.register()


def plant_before_forward(model_runner: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``ModelRunner.forward`` (outside the owner check): plant one armed foreign slot."""
    table = _table()
    rows = getattr(forward_batch, "req_pool_indices", None)
    if not _STATE.armed or table is None or rows is None or rows.numel() == 0:
        return
    pool = table.cache.req_to_token_pool
    req_to_token = pool.req_to_token
    if getattr(model_runner, "req_to_token_pool", None) is not pool:
        return  # NOTE: a draft runner's compact table is not the cache's
    if getattr(model_runner, "is_draft_worker", False):
        kind: str | None = "draft_forward"
    else:
        kind = "verify" if forward_batch.forward_mode.is_target_verify() else None
    if plant_rows(table, rows.tolist(), req_to_token, kind):
        return
    if table.state is not None:
        _plant_state(table, rows.tolist())
    if table.swa is not None:
        _plant_swa(table, rows.tolist(), req_to_token)


def _plant_swa(table: Any, rows: list[int], req_to_token: Any) -> bool:
    """``swa:<tenant>``: point the sliding-window map entry of the first armed row's first column at a page another
    owner holds in the sliding-window sub-pool."""
    swa = table.swa
    for row in rows:
        owner = int(table.row_owner[row])
        armed = f"swa:{tenant_of(table.namespace_of(owner))}"
        if owner < 0 or armed not in _STATE.armed:
            continue
        foreign = ((swa.page_owner != owner) & (swa.page_owner > table.zero_owner)).nonzero().flatten()
        if foreign.numel() == 0:
            return False
        full = int(req_to_token[row, 0])
        _STATE.armed.discard(armed)
        _STATE.planted_swa[row] = (full, int(swa.mapping[full]))
        _STATE.planted_count += 1
        swa.mapping[full] = int(foreign[0]) * swa.page_size
        logger.warning("sglang-iso: TEST plant of a foreign sliding-window page into row %d", row)
        return True
    return False


def _plant_state(table: Any, rows: list[int]) -> bool:
    """``state:<tenant>``: point the first armed row's recurrent-state slot at another namespace's tree snapshot."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    cache = table.cache
    for row in rows:
        ns = table.namespace_of(int(table.row_owner[row]))
        armed = f"state:{tenant_of(ns)}"
        if ns is None or armed not in _STATE.armed:
            continue
        scopes = cache._scopes()
        foreign = [
            int(node.component_data[ComponentType.MAMBA].value)
            for node, scope in cache._nodes()
            if node.component_data[ComponentType.MAMBA].value is not None
            and scopes.get(scope) is not None
            and scopes[scope].key != ns
        ]
        if not foreign:
            return False
        mapping = cache.req_to_token_pool.req_index_to_mamba_index_mapping
        _STATE.armed.discard(armed)
        _STATE.planted_state[row] = int(mapping[row])
        _STATE.planted_count += 1
        mapping[row] = foreign[0]
        logger.warning("sglang-iso: TEST plant of another namespace's state snapshot into row %d", row)
        return True
    return False


def plant_rows(table: Any, rows: list[int], req_to_token: Any, kind: str | None) -> bool:
    """Plant into the first of ``rows`` whose tenant is armed (plain, or for pass ``kind``); at most one."""
    for row in rows:
        owner = int(table.row_owner[row])
        if owner >= 0 and _plant(table, row, owner, req_to_token, kind):
            return True
    return False


def restore_before_results(scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``process_batch_result`` (outside the owner check's abort): read the planted slot back, restore it."""
    table = _table()
    if table is None or batch is None or not (_STATE.planted or _STATE.planted_state or _STATE.planted_swa):
        return
    table.drain()  # NOTE: the owner check's own drain then finds nothing pending; the rows to abort stay marked
    req_to_token = table.cache.req_to_token_pool.req_to_token
    for req in getattr(batch, "reqs", None) or []:
        row = req.kv.req_pool_idx
        if row is None or int(row) not in table.violating_rows:
            continue
        if int(row) in _STATE.planted_swa:
            full, own = _STATE.planted_swa.pop(int(row))
            swa = table.swa
            _STATE.planted_swa_redirected += int(swa.mapping[full]) // swa.page_size == swa.zero_page
            swa.mapping[full] = own  # its own sliding-window slot back
        if int(row) in _STATE.planted_state:
            mapping = table.cache.req_to_token_pool.req_index_to_mamba_index_mapping
            _STATE.planted_state_redirected += int(mapping[int(row)]) == table.state.zero_slot
            mapping[int(row)] = _STATE.planted_state.pop(int(row))  # its own slot back
        for pos, original in _STATE.planted.pop(int(row), []):
            _STATE.planted_read_zero += _reads_zero(table, int(req_to_token[int(row), pos]))
            req_to_token[int(row), pos] = original  # give the row its own slot back


def arm(original: Any, controller: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``set_internal_state``: ``sglang_iso_testing.plant:<tenant>`` arms one plant."""
    requested = getattr(recv_req, "server_args", None) or {}
    ours = [k for k in requested if isinstance(k, str) and k.startswith(COMMAND)]
    if not ours:
        return original(controller, recv_req, *args, **kwargs)
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    if len(ours) != len(requested) or _table() is None:
        return SetInternalStateReqOutput(updated=False)
    _STATE.armed.update(k[len(COMMAND) :] for k in ours)
    return SetInternalStateReqOutput(updated=True)


def report(result: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``get_internal_state``: the plant's counters (and the draft-pool ones of ``spec_plant``)."""
    from sglang_iso_testing import spec_plant

    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        state["sglang_iso_testing"] = {
            "armed": sorted(_STATE.armed),
            "planted": _STATE.planted_count,
            "planted_read_zero": _STATE.planted_read_zero,
            "planted_state_redirected": _STATE.planted_state_redirected,
            "planted_swa_redirected": _STATE.planted_swa_redirected,
            **spec_plant.COUNTERS,
        }


def _table() -> Any:
    from sglang_iso.integration import runtime

    return runtime.owner_table()


def _plant(table: Any, row: int, owner: int, req_to_token: Any, kind: str | None) -> bool:
    """Write one slot of a page another owner holds at position 0 of ``row``, if its tenant is armed."""
    ns = table.namespace_of(owner)
    tenant = tenant_of(ns)
    armed = next((a for a in (tenant, f"{kind}:{tenant}" if kind else None) if a in _STATE.armed), None)
    if tenant is None or armed is None:
        return False
    foreign = ((table.page_owner != owner) & (table.page_owner > table.zero_owner)).nonzero().flatten()
    if foreign.numel() == 0:
        return False
    _STATE.armed.discard(armed)
    _STATE.planted.setdefault(row, []).append((0, int(req_to_token[row, 0])))
    _STATE.planted_count += 1
    req_to_token[row, 0] = int(foreign[0]) * table.page_size
    logger.warning("sglang-iso: TEST plant of a foreign slot into row %d", row)
    return True


def _reads_zero(table: Any, slot: int) -> bool:
    """``slot`` lies in the zero page and that page is zero in every KV buffer (target and draft)."""
    import torch

    from sglang_iso.integration.scrub import kv_buffers

    if slot // table.page_size != table.zero_page:
        return False
    lo, hi = table.zero_page * table.page_size, (table.zero_page + 1) * table.page_size
    buffers = kv_buffers(table.kv_allocator.get_kvcache()) + list(table.draft_buffers)
    return bool(buffers) and all(int(torch.count_nonzero(b[lo:hi])) == 0 for b in buffers)
