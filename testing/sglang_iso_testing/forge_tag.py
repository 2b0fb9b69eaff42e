"""Test-only server plugin: a request whose prompt contains :data:`MARKER` reaches the scheduler with a forged tag.

Loaded like :mod:`sglang_iso_testing.plant` (:func:`plugin_env`: ``SGLANG_ISO_TEST_PLUGINS`` with
``SGLANG_ISO_TESTING=1``; the launcher refuses the first without the second). Before the scheduler takes the
request in, its namespace tag keeps its tenant and namespace id but gets a MAC of zeros, as if a component behind
the gate had forged it: the tree cache must refuse it (served without prefix sharing, counted as an isolation
violation of ``tenant="unverified"``), which is what the monitoring tests make an alert fire on.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_iso import envvars

logger = logging.getLogger(__name__)

MARKER = "sglang-iso-test:forge-tag"
TARGET = "sglang.srt.managers.scheduler.Scheduler.handle_generate_request"


def plugin_env() -> dict[str, str]:
    """Environment for a server that loads this plugin (test harness only)."""

    return {envvars.TESTING.name: "1", envvars.TEST_PLUGINS.name: __name__}


def register() -> None:
    """Hook the scheduler's request intake (called by sglang-iso's plugin in every SGLang process)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, forge_before, HookType.BEFORE)


def forge_before(scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``handle_generate_request``: zero the MAC of a marked request's tag."""
    text = getattr(recv_req, "input_text", None)
    tag = getattr(recv_req, "extra_key", None)
    if not isinstance(text, str) or MARKER not in text or not isinstance(tag, str):
        return
    parts = tag.split(".")
    if len(parts) < 4:
        return
    parts[3] = "0" * len(parts[3])
    recv_req.extra_key = ".".join(parts)
    logger.warning("sglang-iso TEST: forged the namespace tag of request %s", getattr(recv_req, "rid", "?"))
