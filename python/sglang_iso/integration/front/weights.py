"""A weight update changes every later namespace and drops the entries cached under the old weights."""

from __future__ import annotations

import logging
from typing import Any

from sglang_iso import observability
from sglang_iso.integration.front import state
from sglang_iso.settings import current as current_settings

logger = logging.getLogger(__name__)


def after_weight_update(original: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND every weight-update entry point: new weights get new namespaces, old entries are dropped.

    The model fingerprint in every later tag changes, so nothing cached under the
    old weights can match again, even when the caller asked SGLang not to flush
    (``flush_cache: false``) or its flush was refused; then every tenant's
    unlocked entries are released (and scrubbed) in the scheduler.
    """

    async def run() -> Any:
        try:
            return await original(manager, *args, **kwargs)
        finally:
            front = state.current()
            if front is not None and current_settings().tenants_file is not None:
                front.bump_weights()
                await _flush_all(manager)
                observability.audit("weights_updated", generation=front.weights_generation)

    return run()


async def _flush_all(manager: Any) -> None:
    from sglang_iso.integration import commands

    try:
        await commands.send(manager, commands.flush("*"))
    except Exception:  # NOTE: namespaces already changed; a failed flush only delays eviction
        logger.exception("sglang-iso: flushing old namespaces after a weight update failed")
