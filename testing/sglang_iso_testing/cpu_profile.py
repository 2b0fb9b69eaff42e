"""Test-only server plugin: each process's CPU time by function (cProfile), in sglang-iso and the comparison server.

Loaded through :func:`plugin_env` (``SGLANG_ISO_TEST_PLUGINS=sglang_iso_testing.cpu_profile``, ``SGLANG_ISO_TESTING=1``
and ``SGLANG_ISO_CPU_PROFILE_DIR``). In every SGLang process of a server (the HTTP process, the scheduler, the
detokenizer), ``SIGUSR2`` starts a profile of the process's main thread (the event loop of each), timed by that
thread's own CPU clock (``time.thread_time_ns``); the next ``SIGUSR2`` stops it and writes ``<dir>/<pid>.prof``
(:mod:`pstats`). Time the thread spends waiting, or preempted by other processes, is not counted: on a machine with
two cores a phase's wall time moves with whatever else runs, its CPU time much less. cProfile adds its own cost to
every Python call, more to code that makes many small calls: compare a function between the two servers, or a
server's frames with each other, not with wall times.

:func:`own_ms` reads what sglang-iso's own code took in one profile: the Python time of its frames and of the built-ins
(``tolist``, numpy, torch) they call directly, not the SGLang functions its hooks wrap (those run in upstream too).
"""

from __future__ import annotations

import cProfile
import logging
import os
import pstats
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from sglang_iso import envvars

if TYPE_CHECKING:
    from sglang_iso_testing.process import ServerProcess

logger = logging.getLogger(__name__)

MEASURES_BASELINE = True
"""The comparison server loads this plugin too (see :func:`sglang_iso.plugin.register`)."""

SIGNAL = signal.SIGUSR2
"""Starts and stops the profile (SGLang handles neither ``SIGUSR1`` nor ``SIGUSR2``)."""
OWN_PARTS = ("/sglang_iso/", "/sglang_iso_kernels/")
"""Path parts of sglang-iso's own source files (the test plugins, ``sglang_iso_testing``, are not counted)."""

PARTS: dict[str, tuple[str, ...]] = {
    "gate": ("server/gate.py", "server/request_rules.py", "server/admission.py", "server/rate_limits.py",
             "server/adapters.py", "server/pd_rules.py", "tenancy/"),
    "tokenizer-manager hooks": ("integration/front/", "integration/dp_routing.py", "integration/lora.py",
                                "server/tagging.py", "server/retention.py"),
    "request guard": ("integration/request_guard.py",),
    "fairness": ("integration/fairness.py",),
    "tree": ("integration/tenant_cache.py", "cache/", "integration/hybrid_cache.py", "integration/host_cache.py"),
    "owner check": ("integration/owner_check.py", "sglang_iso_kernels/row_check.py", "sglang_iso_kernels/_row_check",
                    "sglang_iso_kernels/verified_rows.py", "integration/swa_owner.py", "integration/state_owner.py"),
    "scrub": ("integration/scrub.py", "integration/mamba_scrub.py", "sglang_iso_kernels/scrub.py",
              "sglang_iso_kernels/_scrub"),
    "allocator tap": ("integration/allocator_tap.py",),
}  # fmt: skip
"""The parts of sglang-iso a profile's frames are summed into (:attr:`Own.parts`), by path; anything else is
``other`` (e.g. ``integration/runtime.py`` and ``identity/``, shared by several)."""

_profile: list[cProfile.Profile] = []
"""The running profile of this process (empty when none)."""


def plugin_env(directory: Path) -> dict[str, str]:
    """Environment for a server (sglang-iso or the comparison server) that loads this plugin, writing to
    ``directory``."""
    return {
        envvars.TESTING.name: "1",
        envvars.TEST_PLUGINS.name: __name__,
        envvars.CPU_PROFILE_DIR.name: str(directory),
    }


def register() -> None:
    """Install the ``SIGUSR2`` handler (called by sglang-iso's plugin in every SGLang process, on its main thread)."""
    directory = envvars.CPU_PROFILE_DIR.get()
    if not directory:
        raise RuntimeError(f"{__name__} needs {envvars.CPU_PROFILE_DIR.name} (a directory for the profiles)")
    try:
        signal.signal(SIGNAL, lambda _signum, _frame: toggle(Path(directory)))
    except ValueError:  # NOTE: not the main thread (never in SGLang's processes): the profile cannot be driven
        logger.warning("sglang-iso: %s not installed in pid %d (not the main thread)", __name__, os.getpid())


def toggle(directory: Path) -> Path | None:
    """Start a profile of this thread, or stop the running one and write it; the path written, if any."""
    if not _profile:
        profile = cProfile.Profile(time.thread_time_ns, 1e-9)
        _profile.append(profile)
        profile.enable()
        return None
    profile = _profile.pop()
    profile.disable()
    path = directory / f"{os.getpid()}.prof"
    partial = path.with_suffix(".partial")
    profile.dump_stats(str(partial))
    os.replace(partial, path)  # NOTE: the reader waits for this name: it appears whole
    return path


def toggle_server(server: ServerProcess) -> dict[int, str]:
    """Send :data:`SIGNAL` to the server's HTTP process, scheduler and detokenizer (never to its other processes:
    for them the signal's default action is to exit); their pids by role."""
    roles: dict[int, str] = {}
    for proc, role in server.processes():
        if role is not None:
            proc.send_signal(SIGNAL)
            roles[proc.pid] = role
    return roles


def read_server(directory: Path, roles: dict[int, str], server: str, timeout_s: float = 30.0) -> dict[str, Own]:
    """Each role's profile (:func:`own_ms`), once the processes stopped by :func:`toggle_server` wrote them; each file
    is renamed ``<server>-<role>.prof``.

    Raises:
        TimeoutError: a process did not write its profile within ``timeout_s`` (busy in one long call, or gone).
    """
    deadline = time.monotonic() + timeout_s
    out: dict[str, Own] = {}
    for pid, role in roles.items():
        path = directory / f"{pid}.prof"
        while not path.exists():  # bounded: until the deadline
            if time.monotonic() > deadline:
                raise TimeoutError(f"no profile from the {role} (pid {pid}) in {timeout_s:g} s")
            time.sleep(0.1)
        named = path.rename(directory / f"{server}-{role}.prof")
        out[role] = own_ms(named)
    return out


class Own(NamedTuple):
    """One profile read by :func:`own_ms` (milliseconds of thread CPU, over the whole profile)."""

    total_ms: float
    """Every function's own time: the thread's CPU while profiled, part of the profiler's own cost included."""
    own_ms: float
    """sglang-iso's frames and the built-ins they call directly."""
    top: list[tuple[str, float]]
    """sglang-iso's frames, each with its own time and that of the built-ins it calls, largest first."""
    parts: dict[str, float]
    """:attr:`top` summed by :data:`PARTS` (those with any time; ``other`` for frames in none), largest first."""


def own_ms(path: Path, parts: tuple[str, ...] = OWN_PARTS) -> Own:
    """Read a profile written by :func:`toggle`."""
    stats: dict[Any, Any] = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in stats.values())
    by_frame: dict[str, float] = {}

    def ours(func: tuple[str, int, str]) -> bool:
        return any(part in func[0] for part in parts)

    for func, (_cc, _nc, tottime, _ct, callers) in stats.items():
        if ours(func):
            by_frame[_name(func)] = by_frame.get(_name(func), 0.0) + tottime
        elif func[0] == "~":  # a built-in: its time under each of our callers is ours
            for caller, (_c, _n, caller_tt, _cum) in callers.items():
                if ours(caller):
                    by_frame[_name(caller)] = by_frame.get(_name(caller), 0.0) + caller_tt
    top = sorted(((name, 1e3 * s) for name, s in by_frame.items()), key=lambda row: -row[1])
    summed: dict[str, float] = {}
    for name, ms in top:
        part = next((p for p, paths in PARTS.items() if any(path in name for path in paths)), "other")
        summed[part] = summed.get(part, 0.0) + ms
    return Own(1e3 * total, sum(ms for _, ms in top), top, dict(sorted(summed.items(), key=lambda row: -row[1])))


def _name(func: tuple[str, int, str]) -> str:
    file, line, name = func
    for part in OWN_PARTS:
        if part in file:
            file = part.strip("/") + "/" + file.split(part, 1)[1]
            break
    return f"{file}:{line}:{name}"
