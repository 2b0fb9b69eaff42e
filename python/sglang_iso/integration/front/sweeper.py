"""Retention and erasure in the HTTP process: requests tracked per owner, a sweeper dropping expired caches.

The limits and the bookkeeping are :mod:`sglang_iso.server.retention`; this module feeds it from the requests
(:func:`track`, wrapped around each tagged request's outputs) and runs the sweeper task (:func:`sweep`, started by
the gate on the server's first ASGI event), which erases (:func:`erase`: every tier, freed pages zeroed at once, a
receipt) the cache of each owner due and of each owner a reload removed from the tenants file. :func:`erase` is also
``POST /iso/tenants/{id}/erase``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from sglang_iso import observability
from sglang_iso.integration import commands
from sglang_iso.integration.front.state import FrontState
from sglang_iso.server.retention import Retention

logger = logging.getLogger(__name__)


async def track(outputs: Any, owner: str, retention: Retention) -> AsyncIterator[Any]:
    """Pass ``outputs`` through; the owner's request counts as in flight from its first output request to its
    end (served, failed or cancelled)."""
    retention.started(owner)
    try:
        async for out in outputs:
            yield out
    finally:
        retention.finished(owner)


async def erase(tokenizer_manager: Any, owner: str, tenant: str) -> dict[str, Any]:
    """Erase ``owner``'s cache on every rank; the receipt (per rank and totals) of what each tier held."""
    receipt_id = secrets.token_hex(8)
    erased_at = round(time.time(), 3)
    results = await commands.send(tokenizer_manager, commands.erase(owner, receipt_id))
    states = await tokenizer_manager.get_internal_state()
    states = sorted(states, key=lambda s: s.get("sglang_iso", {}).get("dp_rank", 0))  # replies come unordered
    ranks = [s.get("sglang_iso", {}).get("erase_receipts", {}).get(receipt_id) for s in states]
    found = [r for r in ranks if isinstance(r, dict)]
    totals = {k: sum(int(r.get(k, 0)) for r in found) for k in (found[0] if found else {})}
    ok = bool(results) and all(results) and len(found) == len(ranks) == len(results)
    return {
        "receipt_id": receipt_id,
        "tenant": tenant,
        "namespace_owner": owner,
        "erased_at": erased_at,
        "erased": ok,
        "complete": ok and totals.get("device_tokens_held", 0) == 0 and totals.get("pd_pages_fenced", 0) == 0,
        "totals": totals,
        "ranks": ranks,
    }


async def sweep(tokenizer_manager: Any, front: FrontState) -> None:
    """Forever: erase the caches of owners removed from the tenants file and of those whose retention passed (each
    audit-logged with its receipt), then sleep a little."""
    while True:
        await asyncio.sleep(front.retention.next_check_s())
        for owner in sorted(front.removed_owners):
            try:
                receipt = await erase(tokenizer_manager, owner, owner)
            except Exception:  # NOTE: the next sweep tries again; serving goes on
                logger.exception("sglang-iso: erasing removed tenant %s failed", owner)
                continue
            if receipt["erased"]:
                front.removed_owners.discard(owner)
                logger.warning("sglang-iso: removed tenant %s erased: %s", owner, receipt["totals"])
                observability.audit("tenant_removed_erased", **receipt)
        for owner, reason in front.retention.due():
            try:
                receipt = await erase(tokenizer_manager, owner, owner)
            except Exception:  # NOTE: the next sweep tries again; serving goes on
                logger.exception("sglang-iso: retention drop of %s failed", owner)
                continue
            if not receipt["erased"]:
                logger.error("sglang-iso: retention drop of %s not confirmed by every rank; retrying", owner)
                continue
            front.retention.dropped(owner, reason)
            logger.info("sglang-iso: cache of %s expired (%s), erased: %s", owner, reason, receipt["totals"])
            observability.audit("cache_expired", owner=owner, reason=reason, **receipt)


def start_sweeper(tokenizer_manager: Any, front: FrontState) -> None:
    """Start :func:`sweep` on the running event loop (kept on ``front``, so it is not collected)."""
    front.sweeper = asyncio.get_running_loop().create_task(sweep(tokenizer_manager, front))
