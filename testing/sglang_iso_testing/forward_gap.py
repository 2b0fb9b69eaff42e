"""Test-only server plugin: what time spent between two forwards costs the forward after it, in a serving scheduler.

Loaded through ``SGLANG_ISO_TEST_PLUGINS=sglang_iso_testing.forward_gap`` with ``SGLANG_ISO_TESTING=1``
(:func:`plugin_env`). It declares :data:`MEASURES_BASELINE`, so the comparison server loads it too:
``benchmark/forward_gap.py`` runs it there, in upstream's own scheduler, with nothing of sglang-iso's in its loop.
Once the scheduler is built (``Scheduler.__init__`` AFTER) it wraps ``ModelRunner.forward`` on its class: every
second call first holds the scheduler thread for ``SGLANG_ISO_FORWARD_GAP_US`` microseconds (a busy loop on the
clock that reads no data: time alone, as a scheduler's own Python work between two forwards spends it); the other
calls run as they come. Each forward's wall time and its thread's CPU time (``time.thread_time``; on CPU the model
runs on this thread and the thread pool it waits for) go to ``TOTALS["<mode>/gap"]`` or ``TOTALS["<mode>/none"]``
(the batch's forward mode): one server, its batches taken alternately, so the machine's drift falls on both halves
alike and their difference is what the gap cost the forward after it. With a gap of 0 both halves run alike: the
split's own A/A control. Reported in ``/get_server_info`` as ``internal_states[i]["forward_gap"]``:
``{"gap_us": N, "totals": {key: [wall_s, cpu_s, calls]}}``.

Do not load it with :mod:`sglang_iso_testing.phase_timer`: the wait would count in the phase timer's forward.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from sglang_iso import envvars

logger = logging.getLogger(__name__)

MEASURES_BASELINE = True
"""The comparison server loads this plugin too (see :func:`sglang_iso.plugin.register`)."""

KEY = "forward_gap"
GAP = "gap"
NONE = "none"
_MODEL_RUNNER = "sglang.srt.model_executor.model_runner:ModelRunner"

TOTALS: dict[str, list[float]] = {}
"""``<mode>/gap`` or ``<mode>/none`` -> [wall seconds, CPU seconds, calls] of the forwards (scheduler thread)."""


def plugin_env(gap_us: int) -> dict[str, str]:
    """Environment for a server that loads this plugin, holding ``gap_us`` before every second forward."""
    return {
        envvars.TESTING.name: "1",
        envvars.TEST_PLUGINS.name: __name__,
        envvars.FORWARD_GAP_US.name: str(gap_us),
    }


def gap_us() -> int:
    """The configured gap in microseconds (:data:`~sglang_iso.envvars.FORWARD_GAP_US`).

    Raises:
        ValueError: the value is not a whole number of microseconds, 0 or more.
    """
    raw = envvars.FORWARD_GAP_US.get() or "0"
    value = int(raw) if raw.isdigit() else -1
    if value < 0:
        raise ValueError(f"{envvars.FORWARD_GAP_US.name}={raw!r}: a whole number of microseconds, 0 or more")
    return value


def register() -> None:
    """Register the hooks (called by sglang-iso's plugin in every SGLang process)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    gap_us()  # NOTE: a bad value stops the server at start, not at its first forward
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.__init__", wrap_forward, HookType.AFTER)
    internal = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
    HookRegistry.register(f"{internal}.get_internal_state", report, HookType.AFTER)


def hold(microseconds: int) -> None:
    """Keep this thread busy for ``microseconds``, reading nothing but the clock."""
    until = time.perf_counter() + microseconds / 1e6
    while time.perf_counter() < until:
        pass


def alternating(fn: Callable[..., Any], microseconds: int) -> Callable[..., Any]:
    """``fn`` (``ModelRunner.forward``) preceded by :func:`hold` on every second call, each call timed into
    :data:`TOTALS` by the forward mode of its batch (its first argument after ``self``) and by gap or none."""
    calls = [0]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        held = calls[0] % 2 == 0
        if held:
            hold(microseconds)
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            wall, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
            batch = args[1] if len(args) > 1 else next(iter(kwargs.values()), None)
            row = TOTALS.setdefault(f"{mode_of(batch)}/{GAP if held else NONE}", [0.0, 0.0, 0])
            row[0] += wall
            row[1] += cpu
            row[2] += 1

    wrapper.__forward_gap__ = microseconds  # type: ignore[attr-defined]
    return wrapper


def mode_of(batch: Any) -> str:
    """A batch's forward mode in lower case (``extend``, ``decode``, ...), ``other`` without one."""
    name = getattr(getattr(batch, "forward_mode", None), "name", None)
    return name.lower() if isinstance(name, str) else "other"


def wrap_forward(_result: Any, _scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``Scheduler.__init__``: wrap ``ModelRunner.forward`` once per process (after the hooks)."""
    import pkgutil

    runner_cls = pkgutil.resolve_name(_MODEL_RUNNER)
    if hasattr(runner_cls.forward, "__forward_gap__"):
        return
    microseconds = gap_us()
    runner_cls.forward = alternating(runner_cls.forward, microseconds)
    logger.warning("sglang-iso: TEST forward gap of %d us before every second forward", microseconds)


def report(result: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``get_internal_state``: the totals so far, and the gap."""
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        state[KEY] = {"gap_us": gap_us(), "totals": {key: list(row) for key, row in TOTALS.items()}}


def cost(before: dict[str, list[float]], after: dict[str, list[float]], mode: str) -> dict[str, float] | None:
    """Between two reports' totals, for ``mode``: milliseconds of wall time and of CPU per forward after a gap and
    after none, and the forwards of each; None when either half has no forward in between."""
    out: dict[str, float] = {}
    for half in (GAP, NONE):
        key = f"{mode}/{half}"
        now, then = after.get(key, [0.0, 0.0, 0]), before.get(key, [0.0, 0.0, 0])
        wall, cpu, calls = (a - b for a, b in zip(now, then, strict=True))
        if calls <= 0:
            return None
        out[f"{half}_wall_ms"] = 1e3 * wall / calls
        out[f"{half}_cpu_ms"] = 1e3 * cpu / calls
        out[f"{half}_forwards"] = calls
    return out
