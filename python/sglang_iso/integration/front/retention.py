"""Retention in the HTTP process: each owner's requests are tracked, and a sweeper drops expired caches.

The limits and the bookkeeping are :mod:`sglang_iso.server.retention`; this module feeds it from the requests
(:func:`track`, wrapped around each tagged request's outputs) and runs the sweeper task (:func:`sweep`, started by
the gate on the server's first ASGI event), which sends the tenant flush to every scheduler for each owner due.
"""

from __future__ import annotations

import asyncio
import logging
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


async def sweep(tokenizer_manager: Any, front: FrontState) -> None:
    """Forever: drop the caches of the owners due (tenant flush on every rank), then sleep a little."""
    while True:
        await asyncio.sleep(front.retention.next_check_s())
        for owner, reason in front.retention.due():
            try:
                results = await commands.send(tokenizer_manager, commands.flush(owner))
            except Exception:  # NOTE: the next sweep tries again; serving goes on
                logger.exception("sglang-iso: retention drop of %s failed", owner)
                continue
            if not results or not all(results):
                logger.error("sglang-iso: retention drop of %s not confirmed by every rank; retrying", owner)
                continue
            front.retention.dropped(owner, reason)
            logger.info("sglang-iso: cache of %s expired (%s): dropped in every tier", owner, reason)
            observability.audit("cache_expired", owner=owner, reason=reason)


def start_sweeper(tokenizer_manager: Any, front: FrontState) -> None:
    """Start :func:`sweep` on the running event loop (kept on ``front``, so it is not collected)."""
    front.sweeper = asyncio.get_running_loop().create_task(sweep(tokenizer_manager, front))
