"""Test-only server plugin: fault injection for PD transfers.

Loaded like :mod:`sglang_iso_testing.plant` (:func:`plugin_env`: ``SGLANG_ISO_TEST_PLUGINS`` with
``SGLANG_ISO_TESTING=1``; the launcher refuses the first without the second). It replaces
``sglang_iso.integration.pd_transfer.FAULTS`` (a no-op seam) and stands in for a misbehaving peer or
transport, so the quarantine and the tag check run in the real schedulers. Armed by an admin command,
``POST /set_internal_state {"server_args": {"sglang_iso_testing.pd:<fault>": 1}}``:

* ``forge`` (on a prefill worker): the next transfer is tagged for another
  namespace, as if another tenant's KV had been sent to the decode;
* ``stall`` (decode or prefill worker): the next transfer never completes; when it is aborted, its pages
  are poisoned (a write landing after the abort, as in the incident) and no
  drain is ever reported, so the pages time out and stay quarantined;
* ``check_poison``: True while every quarantined page of a stalled transfer
  still holds the poison (none was handed out and overwritten or scrubbed).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from sglang_iso import envvars
from sglang_iso.integration import pd_transfer, runtime
from sglang_iso.settings import current as current_settings

logger = logging.getLogger(__name__)

COMMAND = "sglang_iso_testing.pd:"
FORGED_NAMESPACE = "sglang-iso/test/forged-namespace"
POISON = 1000.0
FAULTS = ("forge", "stall", "check_poison")

_armed: set[str] = set()
_stalled: dict[str, list[int]] = {}  # transfer key -> its pages (poisoned once aborted)


def plugin_env() -> dict[str, str]:
    """Environment for a server that loads this plugin (test harness only)."""

    return {envvars.TESTING.name: "1", envvars.TEST_PLUGINS.name: __name__}


def register() -> None:
    """Install the fault seam and the arming command (called by sglang-iso's plugin in every SGLang process)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    pd_transfer.FAULTS = _Faults()
    internal = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
    HookRegistry.register(f"{internal}.set_internal_state", arm, HookType.AROUND)


def arm(original: Any, controller: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``set_internal_state``: ``sglang_iso_testing.pd:<fault>`` (alone in its request)."""
    requested = getattr(recv_req, "server_args", None) or {}
    ours = [k for k in requested if isinstance(k, str) and k.startswith(COMMAND)]
    if not ours:
        return original(controller, recv_req, *args, **kwargs)
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    ok = len(ours) == len(requested) and runtime.pd_guard() is not None
    ok = ok and all(handle(k[len(COMMAND) :]) for k in ours)
    return SetInternalStateReqOutput(updated=ok)


class _Faults(pd_transfer.FaultSeam):
    def prefill_namespace(self, namespace: str | None) -> str | None:
        return prefill_namespace(namespace)

    def after_fence(self, guard: Any, endpoint: Any, key: str) -> None:
        after_fence(guard, endpoint, key)

    def probe_override(self, key: str) -> Any:
        return probe_override(key)


def handle(fault: str) -> bool:
    """Arm ``fault`` (or run ``check_poison``); False when refused."""
    if fault not in FAULTS:
        logger.warning("sglang-iso: test PD fault %r refused (unknown)", fault)
        return False
    if fault == "check_poison":
        return poison_intact()
    _armed.add(fault)
    return True


def prefill_namespace(namespace: str | None) -> str | None:
    """Prefill: the namespace to tag a transfer with (another one once ``forge`` is armed)."""
    if "forge" in _armed:
        _armed.discard("forge")
        return FORGED_NAMESPACE
    return namespace


def after_fence(guard: Any, endpoint: Any, key: str) -> None:
    """After a transfer's pages were fenced (decode: published; prefill: a chunk sent): arm a stall.

    ``endpoint`` is the request's KV receiver (decode) or sender (prefill): its poll reports the transfer as
    still running until it is aborted.
    """
    if "stall" not in _armed or key in _stalled:
        return
    _armed.discard("stall")
    _stalled[key] = sorted(guard.quarantine.pages_of(key) or ())
    original_poll = endpoint.poll

    def stalled_poll() -> Any:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if endpoint.conclude_state is None:
            return KVPoll.Transferring
        return original_poll()

    endpoint.poll = stalled_poll


def probe_override(key: str) -> Any:
    """A probe that never reports a drain for a stalled transfer (and poisons its pages now), else None.

    The probe writes the poison again on each poll until the drain deadline: the transfer engine's own write of
    the stalled request's KV can still land in its pages after the abort (the late write this fault stands for),
    and must not read as a page handed to someone else. After the deadline nothing rewrites the poison, so a page
    handed out, overwritten or scrubbed while quarantined is found by ``check_poison``.
    """
    pages = _stalled.get(key)
    if pages is None:
        return None
    guard = runtime.pd_guard()
    if guard is None:
        return lambda: None
    _poison(guard, pages)
    deadline = time.monotonic() + current_settings().pd_drain_timeout_s

    def probe() -> None:
        if time.monotonic() < deadline:
            _poison(guard, pages, quiet=True)

    return probe


def poison_intact() -> bool:
    guard = runtime.pd_guard()
    if guard is None or not _stalled:
        return False
    for key, pages in _stalled.items():
        if guard.quarantine.pages_of(key) is None:
            continue  # reclaimed: scrubbed on release, nothing to check
        for buf in _buffers(guard):
            for page in pages:
                rows = buf[page * guard.page_size : (page + 1) * guard.page_size]
                if not bool(torch.all(rows == POISON)):
                    logger.error("sglang-iso: quarantined page %d of %s lost its poison", page, key)
                    return False
    return True


def _poison(guard: Any, pages: list[int], *, quiet: bool = False) -> None:
    for buf in _buffers(guard):
        for page in pages:
            buf[page * guard.page_size : (page + 1) * guard.page_size] = POISON
    if not quiet:
        logger.warning("sglang-iso: test fault: %d pages written after their transfer was aborted", len(pages))


def _buffers(guard: Any) -> list[torch.Tensor]:
    from sglang_iso.integration.scrub import kv_buffers

    return [b for b in kv_buffers(guard.allocator.get_kvcache()) if b.is_floating_point()]
