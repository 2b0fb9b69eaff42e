"""Test-only forced corruption for the owner check (armed only with ``SGLANG_ISO_TEST_PLANT_FOREIGN=1``).

An admin command arms ``<tenant>`` (its next checked forward), ``verify:<tenant>`` (its next speculative verify
forward), ``draft:<tenant>`` (its next speculative decode step, before the draft plans attention) or
``draft_forward:<tenant>`` (its next forward of a draft model: a draft extend or draft decode step). The armed
check writes a slot of a page another owner holds at position 0 of the tenant's row just before sanitizing it;
the request must then be aborted and the slot found redirected to the all-zero page.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang_iso.integration.owner_check import OwnerTable

logger = logging.getLogger(__name__)


def plant_batch(table: OwnerTable, rows: list[int], req_to_token: torch.Tensor, kind: str | None = None) -> None:
    """Plant into the first row of the batch whose tenant is armed (for ``kind``); at most one per call."""
    from sglang_iso.integration.owner_check import FREE

    for row in rows:
        owner = int(table.row_owner[row])
        if owner != FREE and _plant(table, row, owner, req_to_token, kind):
            return


def reads_zero(table: OwnerTable, slot: int) -> bool:
    """``slot`` lies in the zero page and that page is zero in every KV buffer (target and draft)."""
    from sglang_iso.integration.scrub import kv_buffers

    if slot // table.page_size != table.zero_page:
        return False
    lo, hi = table.zero_page * table.page_size, (table.zero_page + 1) * table.page_size
    buffers = kv_buffers(table.cache.token_to_kv_pool_allocator.get_kvcache()) + table.draft_buffers
    return bool(buffers) and all(int(torch.count_nonzero(b[lo:hi])) == 0 for b in buffers)


def _plant(table: OwnerTable, row: int, owner: int, req_to_token: torch.Tensor, kind: str | None) -> bool:
    ns = table._namespaces.get(owner)
    tenant = table.cache.resolver.tenant_of(ns) if ns else None
    armed = next((a for a in (tenant, f"{kind}:{tenant}" if kind else None) if a in table.armed_plants), None)
    if tenant is None or armed is None:
        return False
    foreign = ((table.page_owner != owner) & (table.page_owner > table.zero_owner)).nonzero().flatten()
    if foreign.numel() == 0:
        return False
    table.armed_plants.discard(armed)
    table._planted.setdefault(row, []).append((0, int(req_to_token[row, 0])))
    req_to_token[row, 0] = int(foreign[0]) * table.page_size
    logger.warning("sglang-iso: TEST plant of a foreign slot into row %d", row)
    return True
