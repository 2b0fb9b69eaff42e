"""Test-only server plugin: wall time of the scheduler's phases, in sglang-iso and in the comparison server alike.

Loaded through ``SGLANG_ISO_TEST_PLUGINS=sglang_iso_testing.phase_timer`` with ``SGLANG_ISO_TESTING=1``
(:func:`plugin_env`). It declares :data:`MEASURES_BASELINE`, so ``python -m sglang_iso.baseline_server`` loads it
too and both servers of a benchmark are timed by the same code at the same points. Once the scheduler is built
(``Scheduler.__init__`` AFTER), it wraps, on their classes, what is there then (sglang-iso's hooks included):

* the loop's phases: ``Scheduler.ingest_requests`` (receiving, ``recv_requests``, then
  ``process_input_requests``, which dispatches each message by type: ``dispatch.<type>``, where a generation
  request's handler runs the request guard), ``get_next_batch_to_run``
  (admission: the fairness order and shares, prefix matching, allocation and the scrub), ``run_batch``,
  ``process_batch_result`` (releases and checkpoints into the tree);
* ``ModelRunner.forward`` (with the owner check, a BEFORE hook on it) and ``ModelRunner._forward_raw`` (the
  model alone): their difference is what runs before the forward;
* the tree cache's ``match_prefix``, ``insert``, ``evict_for_alloc`` (what the allocator calls when short; upstream's
  tree evicts inside it, sglang-iso's through ``evict``), ``evict`` and ``checkpoint``, the owner check
  (``OwnerTable.check_batch``) and the scrub (``KvScrubber.flush``), where present;
* the owner check's parts on the host route (:data:`_ISO_PARTS`): ``owner_check.host`` (``_clean_on_host``, what
  reads the batch into host lists around the checks), ``owner_check.decode_verified`` (a decode step decided from
  its new columns) and ``owner_check.rows_host`` (the windows read in full); what ``owner_check`` holds beyond them
  is the code around them. Each wrapper adds about a microsecond per call to sglang-iso's server alone;
* the garbage collector's passes, ``gc.<generation>`` (a ``gc.callbacks`` entry), inside whichever phase ran them;
* per forward mode as well (``<phase>/extend``, ``<phase>/decode``, ...: the batch's mode): ``run_batch``,
  ``process_batch_result``, the runner's two and the owner check, so a prefill step's cost (what a request's time
  to first token holds) reads apart from a decode step's, and ``run_batch/<mode>``'s calls count the steps.

Each phase accumulates seconds and calls (``time.perf_counter``, scheduler thread; nested phases overlap: a
phase's time includes the phases it calls, except status reads, ``dispatch.GetInternalStateReq``, which are left
out of the phases around them, the timer's own reads included), and beside each phase its CPU twin
(``<phase>@cpu``: the scheduler thread's own CPU time, ``time.thread_time``; on a machine with fewer cores than
runnable threads, the wall time of a phase also holds the time other processes ran while it waited, the twin does
not; the two clock reads add about a microsecond per call). They appear in ``/get_server_info`` under
``internal_states[i]["phase_timer"]`` as ``{phase: [seconds, calls]}``; a benchmark reads them before and after
a run and divides the difference by the ``run_batch`` calls (``benchmark/bench_serving.py --phases``).
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

KEY = "phase_timer"
FROZEN_KEY = "phase_timer_gc_frozen"
"""Also reported: the objects SGLang's post-start freeze moved out of the collector's reach in the scheduler (0: not
frozen; with ``--skip-server-warmup`` the comparison server's own freeze call races its listening, so the benchmarks
make it, :meth:`~sglang_iso_testing.process.ServerProcess.freeze_gc`)."""
STEP = "run_batch"
"""The phase per-step numbers are divided by."""
CPU = "@cpu"
"""Suffix of each phase's CPU twin: ``"owner_check@cpu"`` is the scheduler thread's own CPU time in ``owner_check``
(``time.thread_time``), which leaves out the time the thread waited for a core while another process ran."""

_SCHEDULER = "sglang.srt.managers.scheduler:Scheduler"
_MODEL_RUNNER = "sglang.srt.model_executor.model_runner:ModelRunner"
_LOOP = (
    "ingest_requests",
    "process_input_requests",
    "get_next_batch_to_run",
    "run_batch",
    "process_batch_result",
)
_RUNNER = ("forward", "_forward_raw")
_BY_MODE = frozenset({"run_batch", "process_batch_result"})
"""Loop phases also timed per forward mode (``run_batch/extend``, ...), with the runner's and the owner check's."""
_TREE = ("match_prefix", "insert", "evict_for_alloc", "evict", "checkpoint")
_ISO = (
    ("sglang_iso.integration.owner_check:OwnerTable", "check_batch", "owner_check"),
    ("sglang_iso.integration.scrub:KvScrubber", "flush", "scrub"),
)

_ISO_PARTS = (
    ("sglang_iso.integration.owner_check:OwnerTable", "_clean_on_host", "owner_check.host"),
    ("sglang_iso_kernels.verified_rows:DecodeRoute", "decide", "owner_check.decode_verified"),
    ("sglang_iso.integration.owner_check", "clean_rows_host", "owner_check.rows_host"),
)
"""The owner check's parts: a class's method (``module:Class``) or a function as the owner check's module calls it
(``module``: the name it imported)."""

TOTALS: dict[str, list[float]] = {}
"""Phase -> [seconds, calls] in this process (scheduler thread only)."""
STATUS_READ = "GetInternalStateReq"
"""The message a status read (``/get_server_info``, this plugin's own reads included) sends the scheduler: timed
apart and left out of the phases around it, so reading the totals does not change them."""


class _Excluded:
    """Seconds (wall, and the thread's CPU) spent in status reads so far (subtracted from the phases they ran
    inside)."""

    seconds = 0.0
    cpu_seconds = 0.0


def plugin_env() -> dict[str, str]:
    """Environment for a server (sglang-iso or the comparison server) that loads this plugin."""
    return {envvars.TESTING.name: "1", envvars.TEST_PLUGINS.name: __name__}


def register() -> None:
    """Register the hooks (called by sglang-iso's plugin in every SGLang process)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.__init__", wrap_phases, HookType.AFTER)
    internal = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
    HookRegistry.register(f"{internal}.get_internal_state", report, HookType.AFTER)


def timed(phase: str, fn: Callable[..., Any], *, excluded: bool = False, by_mode: bool = False) -> Callable[..., Any]:
    """``fn`` adding its wall time (less the status reads inside it) and one call to ``TOTALS[phase]``, and its
    thread's CPU time (less theirs) to ``TOTALS[phase + CPU]``; an ``excluded`` phase's times are left out of the
    phases around it. ``by_mode``: also to ``TOTALS[phase + "/" + mode]`` (and its twin), the forward mode of the
    call's first argument after ``self`` (a batch: ``extend``, ``decode``, ...; :func:`mode_of`)."""
    totals = TOTALS.setdefault(phase, [0.0, 0])
    cpu_totals = TOTALS.setdefault(phase + CPU, [0.0, 0])

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before, cpu_before = _Excluded.seconds, _Excluded.cpu_seconds
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start - (_Excluded.seconds - before)
            cpu = time.thread_time() - cpu_start - (_Excluded.cpu_seconds - cpu_before)
            _add(totals, cpu_totals, elapsed, cpu)
            if by_mode:
                split = f"{phase}/{mode_of(args[1] if len(args) > 1 else next(iter(kwargs.values()), None))}"
                _add(TOTALS.setdefault(split, [0.0, 0]), TOTALS.setdefault(split + CPU, [0.0, 0]), elapsed, cpu)
            if excluded:
                _Excluded.seconds += elapsed
                _Excluded.cpu_seconds += cpu

    wrapper.__phase_timer__ = phase  # type: ignore[attr-defined]
    return wrapper


def _add(totals: list[float], cpu_totals: list[float], elapsed: float, cpu: float) -> None:
    totals[0] += elapsed
    totals[1] += 1
    cpu_totals[0] += cpu
    cpu_totals[1] += 1


def mode_of(batch: Any) -> str:
    """A batch's forward mode in lower case (``extend``, ``decode``, ``idle``, ...), ``other`` without one."""
    name = getattr(getattr(batch, "forward_mode", None), "name", None)
    return name.lower() if isinstance(name, str) else "other"


def wrap_method(owner: Any, name: str, phase: str, *, by_mode: bool = False) -> bool:
    """Time ``owner.name`` as ``phase``: a class's method (inherited or not), or a function where a module looks it up
    (the name it imported); False when it is absent or already timed. ``by_mode``: see :func:`timed`."""
    fn = getattr(owner, name, None)
    if not callable(fn) or hasattr(fn, "__phase_timer__"):
        return False
    setattr(owner, name, timed(phase, fn, by_mode=by_mode))
    return True


def wrap_phases(_result: Any, scheduler: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``Scheduler.__init__``: wrap every phase once per process (the classes, after the hooks)."""
    import pkgutil

    scheduler_cls = pkgutil.resolve_name(_SCHEDULER)
    for name in _LOOP:
        wrap_method(scheduler_cls, name, name, by_mode=name in _BY_MODE)
    # NOTE: the scheduler dispatches each message type to a method bound at its start (hooks included): time
    # those, per type (a generation request, and any control message a server sends itself).
    mapping = getattr(getattr(scheduler, "_request_dispatcher", None), "_mapping", None)
    if isinstance(mapping, dict):
        for kind, fn in list(mapping.items()):
            name = getattr(kind, "__name__", str(kind))
            if not hasattr(fn, "__phase_timer__"):
                mapping[kind] = timed(f"dispatch.{name}", fn, excluded=name == STATUS_READ)
    receiver = getattr(scheduler, "request_receiver", None)
    if receiver is not None:
        wrap_method(type(receiver), "recv_requests", "recv_requests")
    runner_cls = pkgutil.resolve_name(_MODEL_RUNNER)
    for name in _RUNNER:
        wrap_method(runner_cls, name, f"model_runner.{name}", by_mode=True)
    tree = getattr(scheduler, "tree_cache", None)
    if tree is not None:
        for name in _TREE:
            wrap_method(type(tree), name, f"tree.{name}")
    for target, name, phase in (*_ISO, *_ISO_PARTS):
        # NOTE: the comparison server never builds these: their phases stay at zero calls there.
        wrap_method(pkgutil.resolve_name(target), name, phase, by_mode=phase == "owner_check")
    time_gc()
    logger.warning("sglang-iso: TEST phase timer on %s", ", ".join(sorted(TOTALS)))


def time_gc() -> None:
    """Time the garbage collector's passes as ``gc.<generation>`` (inside whatever phase triggered them), once per
    process."""
    import gc

    if _gc_pass in gc.callbacks:
        return
    gc.callbacks.append(_gc_pass)


def _gc_pass(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _GcStart.at, _GcStart.cpu_at = time.perf_counter(), time.thread_time()
        return
    name = f"gc.{info.get('generation', '?')}"
    for key, seconds in ((name, time.perf_counter() - _GcStart.at), (name + CPU, time.thread_time() - _GcStart.cpu_at)):
        totals = TOTALS.setdefault(key, [0.0, 0])
        totals[0] += seconds
        totals[1] += 1


class _GcStart:
    """When the collector's current pass began (wall, and the thread's CPU clock)."""

    at = 0.0
    cpu_at = 0.0


def report(result: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``get_internal_state``: the phases' totals so far."""
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        state[KEY] = {phase: [seconds, int(calls)] for phase, (seconds, calls) in TOTALS.items()}
        from sglang_iso.integration.hooks import frozen_objects

        state[FROZEN_KEY] = frozen_objects()


def per_step(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, tuple[float, int]]:
    """Milliseconds of each phase per :data:`STEP` call between two reports, and the phase's calls then."""
    steps = after.get(STEP, [0.0, 0])[1] - before.get(STEP, [0.0, 0])[1]
    out: dict[str, tuple[float, int]] = {}
    for phase, (seconds, calls) in after.items():
        seconds0, calls0 = before.get(phase, [0.0, 0])
        if steps > 0 and calls > calls0:
            out[phase] = (1e3 * (seconds - seconds0) / steps, int(calls - calls0))
    return out
