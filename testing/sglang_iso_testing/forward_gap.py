"""Test-only server plugin: what time spent between two forwards costs the forward after it, in a serving scheduler.

Loaded through ``SGLANG_ISO_TEST_PLUGINS=sglang_iso_testing.forward_gap`` with ``SGLANG_ISO_TESTING=1``
(:func:`plugin_env`). It declares :data:`MEASURES_BASELINE`, so the comparison server loads it too:
``benchmark/forward_gap.py`` runs it there, in upstream's own scheduler, with nothing of sglang-iso's in its loop.
Once the scheduler is built (``Scheduler.__init__`` AFTER) it wraps ``ModelRunner.forward`` on its class: every
second call first holds the scheduler thread for ``SGLANG_ISO_FORWARD_GAP_US`` microseconds (a busy loop on the
clock: time alone, as a scheduler's own Python work between two forwards spends it), writing all along, when
``SGLANG_ISO_FORWARD_GAP_KB`` is set, over a private buffer of that many kilobytes (the caches such work would take
from the forward); the other calls run as they come. Each forward's wall time and its thread's CPU time
(``time.thread_time``; on CPU the model runs on this thread and the thread pool it waits for) go to
``TOTALS["<mode>/gap"]`` or ``TOTALS["<mode>/none"]`` (the batch's forward mode), the holds to ``TOTALS["hold"]``:
one server, its batches taken alternately, so the machine's drift falls on both halves alike and their difference
is what the gap cost the forward after it. With a gap of 0 both halves run alike: the split's own A/A control.
Reported in ``/get_server_info`` as ``internal_states[i]["forward_gap"]``:
``{"gap_us": N, "gap_kb": K, "totals": {key: [wall_s, cpu_s, calls]}}``.

Do not load it with :mod:`sglang_iso_testing.phase_timer`: the wait would count in the phase timer's forward.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from sglang_iso import envvars
from sglang_iso_testing.phase_timer import mode_of

logger = logging.getLogger(__name__)

MEASURES_BASELINE = True
"""The comparison server loads this plugin too (see :func:`sglang_iso.plugin.register`)."""

KEY = "forward_gap"
GAP = "gap"
NONE = "none"
HOLD = "hold"
"""The holds themselves: [wall seconds, 0, calls] (a hold over a large buffer outlasts the gap asked for)."""
_MODEL_RUNNER = "sglang.srt.model_executor.model_runner:ModelRunner"

TOTALS: dict[str, list[float]] = {}
"""``<mode>/gap`` or ``<mode>/none`` -> [wall seconds, CPU seconds, calls] of the forwards (scheduler thread), and
:data:`HOLD`."""


def plugin_env(gap_us: int, gap_kb: int = 0) -> dict[str, str]:
    """Environment for a server that loads this plugin, holding ``gap_us`` before every second forward (writing over
    ``gap_kb`` kilobytes meanwhile)."""
    return {
        envvars.TESTING.name: "1",
        envvars.TEST_PLUGINS.name: __name__,
        envvars.FORWARD_GAP_US.name: str(gap_us),
        envvars.FORWARD_GAP_KB.name: str(gap_kb),
    }


def gap_us() -> int:
    """The configured gap in microseconds (:data:`~sglang_iso.envvars.FORWARD_GAP_US`).

    Raises:
        ValueError: the value is not a whole number, 0 or more.
    """
    return _whole(envvars.FORWARD_GAP_US)


def gap_kb() -> int:
    """The kilobytes written during each gap (:data:`~sglang_iso.envvars.FORWARD_GAP_KB`).

    Raises:
        ValueError: the value is not a whole number, 0 or more.
    """
    return _whole(envvars.FORWARD_GAP_KB)


def _whole(var: envvars.EnvVar) -> int:
    raw = var.get() or "0"
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"{var.name}={raw!r}: a whole number, 0 or more")
    return int(raw)


def register() -> None:
    """Register the hooks (called by sglang-iso's plugin in every SGLang process)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    gap_us(), gap_kb()  # NOTE: a bad value stops the server at start, not at its first forward
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.__init__", wrap_forward, HookType.AFTER)
    internal = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
    HookRegistry.register(f"{internal}.get_internal_state", report, HookType.AFTER)


def hold(microseconds: int, buffer: bytearray | None = None) -> None:
    """Keep this thread busy for ``microseconds``; with ``buffer``, writing over the whole of it again and again (at
    least once) meanwhile, a 4 KiB page at a time."""
    until = time.perf_counter() + microseconds / 1e6
    if buffer is None:
        while time.perf_counter() < until:
            pass
        return
    page = b"\x01" * 4096
    while True:
        for at in range(0, len(buffer), 4096):
            buffer[at : at + 4096] = page[: len(buffer) - at]
        if time.perf_counter() >= until:
            return


def alternating(fn: Callable[..., Any], microseconds: int, kilobytes: int = 0) -> Callable[..., Any]:
    """``fn`` (``ModelRunner.forward``) preceded by :func:`hold` on every second call (over a buffer of
    ``kilobytes``, if any), each call timed into :data:`TOTALS` by the forward mode of its batch (its first argument
    after ``self``) and by gap or none."""
    calls = [0]
    buffer = bytearray(kilobytes * 1024) if kilobytes else None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        held = calls[0] % 2 == 0
        if held:
            hold_start = time.perf_counter()
            hold(microseconds, buffer)
            row = TOTALS.setdefault(HOLD, [0.0, 0.0, 0])
            row[0] += time.perf_counter() - hold_start
            row[2] += 1
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


def wrap_forward(_result: Any, _scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``Scheduler.__init__``: wrap ``ModelRunner.forward`` once per process (after the hooks)."""
    import pkgutil

    runner_cls = pkgutil.resolve_name(_MODEL_RUNNER)
    if hasattr(runner_cls.forward, "__forward_gap__"):
        return
    microseconds, kilobytes = gap_us(), gap_kb()
    runner_cls.forward = alternating(runner_cls.forward, microseconds, kilobytes)
    logger.warning("sglang-iso: TEST forward gap of %d us (%d KB written) before every second forward", microseconds,
                   kilobytes)  # fmt: skip


def report(result: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``get_internal_state``: the totals so far, and the gap."""
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        totals = {key: list(row) for key, row in TOTALS.items()}
        state[KEY] = {"gap_us": gap_us(), "gap_kb": gap_kb(), "totals": totals}


def cost(before: dict[str, list[float]], after: dict[str, list[float]], mode: str) -> dict[str, float] | None:
    """Between two reports' totals, for ``mode``: milliseconds of wall time and of CPU per forward after a gap and
    after none, the forwards of each, and the holds' mean length (``hold_ms``, every mode's); None when either half
    has no forward in between."""
    held_now, _, holds_now = after.get(HOLD, [0.0, 0.0, 0])
    held_then, _, holds_then = before.get(HOLD, [0.0, 0.0, 0])
    holds = holds_now - holds_then
    out: dict[str, float] = {"hold_ms": 1e3 * (held_now - held_then) / holds if holds > 0 else 0.0}
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
