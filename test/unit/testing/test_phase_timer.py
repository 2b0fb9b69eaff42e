"""The phase timer's bookkeeping: nested phases, status reads left out, per-step differences."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso_testing import phase_timer


@pytest.fixture(autouse=True)
def _fresh_totals() -> Iterator[None]:
    saved = dict(phase_timer.TOTALS)
    phase_timer.TOTALS.clear()
    yield
    phase_timer.TOTALS.clear()
    phase_timer.TOTALS.update(saved)


def _sleep(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_status_read_inside_a_phase_is_left_out_of_it() -> None:
    read = phase_timer.timed("dispatch.GetInternalStateReq", lambda: _sleep(0.05), excluded=True)
    work = phase_timer.timed("dispatch.TokenizedGenerateReqInput", lambda: _sleep(0.01))

    def intake(with_read: bool) -> None:
        work()
        if with_read:
            read()

    outer = phase_timer.timed("process_input_requests", intake)
    outer(False)  # positive control: the phase's own work is counted
    own = phase_timer.TOTALS["process_input_requests"][0]
    assert own >= 0.01
    outer(True)
    with_read = phase_timer.TOTALS["process_input_requests"][0] - own
    assert phase_timer.TOTALS["dispatch.GetInternalStateReq"] == [pytest.approx(0.05, abs=0.04), 1]
    assert 0.01 <= with_read < 0.05, "the status read was counted in the phase around it"
    assert phase_timer.TOTALS["process_input_requests"][1] == 2


def test_a_phase_s_cpu_twin_counts_the_thread_s_work_not_its_waiting() -> None:
    waiting = phase_timer.timed("recv_requests", lambda: time.sleep(0.05))
    working = phase_timer.timed("run_batch", lambda: _sleep(0.05))
    waiting()
    working()
    cpu = phase_timer.CPU
    assert phase_timer.TOTALS["recv_requests"][0] >= 0.05
    assert phase_timer.TOTALS["recv_requests" + cpu] == [pytest.approx(0.0, abs=0.02), 1]
    # positive control: a busy phase's CPU twin holds its time (the machine may take some of it away)
    assert 0.025 <= phase_timer.TOTALS["run_batch" + cpu][0] <= phase_timer.TOTALS["run_batch"][0] + 0.005
    assert phase_timer.TOTALS["run_batch" + cpu][1] == 1


def test_a_status_read_s_cpu_is_left_out_of_the_phase_around_it() -> None:
    read = phase_timer.timed("dispatch.GetInternalStateReq", lambda: _sleep(0.05), excluded=True)
    outer = phase_timer.timed("process_input_requests", lambda: (_sleep(0.01), read()))
    outer()
    cpu = phase_timer.CPU
    assert phase_timer.TOTALS["dispatch.GetInternalStateReq" + cpu][0] >= 0.025
    assert phase_timer.TOTALS["process_input_requests" + cpu][0] < 0.025, "the status read's CPU was counted"
    assert phase_timer.TOTALS["process_input_requests" + cpu][0] > 0.0


def test_per_step_divides_each_phase_by_the_steps_between_two_reports() -> None:
    before = {"run_batch": [1.0, 10], "owner_check": [0.1, 10], "scrub": [0.5, 3]}
    after = {"run_batch": [3.0, 30], "owner_check": [0.3, 30], "scrub": [0.5, 3], "tree.evict": [0.04, 2]}
    got = phase_timer.per_step(before, after)
    assert got["run_batch"] == (pytest.approx(100.0), 20)
    assert got["owner_check"] == (pytest.approx(10.0), 20)
    assert got["tree.evict"] == (pytest.approx(2.0), 2)  # (a phase first seen in the second report)
    assert "scrub" not in got  # no call between the reports
    assert phase_timer.per_step(after, after) == {}  # no step: nothing to divide by


def test_wrapping_a_method_twice_times_it_once() -> None:
    class Loop:
        def step(self) -> int:
            return 7

    assert phase_timer.wrap_method(Loop, "step", "step")
    assert not phase_timer.wrap_method(Loop, "step", "step")
    assert not phase_timer.wrap_method(Loop, "absent", "absent")
    assert Loop().step() == 7
    assert phase_timer.TOTALS["step"][1] == 1


def test_a_function_is_timed_where_its_caller_looks_it_up() -> None:
    import types

    module = types.ModuleType("caller")
    module.check = lambda rows: rows * 2  # type: ignore[attr-defined]

    def call(rows: int) -> int:
        return module.check(rows)  # type: ignore[no-any-return, attr-defined]

    assert call(3) == 6 and "check" not in phase_timer.TOTALS  # positive control: not timed before wrapping
    assert phase_timer.wrap_method(module, "check", "check")
    assert not phase_timer.wrap_method(module, "check", "check") and not phase_timer.wrap_method(module, "absent", "x")
    assert call(3) == 6 and call(4) == 8
    assert phase_timer.TOTALS["check"][1] == 2


def test_the_owner_checks_parts_name_what_the_owner_check_calls() -> None:
    import pkgutil

    from sglang_iso.integration import owner_check

    for target, name, _phase in phase_timer._ISO_PARTS:
        owner = pkgutil.resolve_name(target)
        assert owner in (owner_check, owner_check.OwnerTable, owner_check.DecodeRoute), (target, name)
        assert callable(getattr(owner, name)), (target, name)
    source = Path(owner_check.__file__).read_text()
    for _target, name, _phase in phase_timer._ISO_PARTS:
        assert f"{name}(" in source, name  # (called there, so wrapping the name times the calls)


def test_the_collectors_passes_are_timed_by_generation_once_per_process() -> None:
    import gc

    phase_timer.time_gc()
    try:
        phase_timer.time_gc()
        assert gc.callbacks.count(phase_timer._gc_pass) == 1
        before = phase_timer.TOTALS.get("gc.2", [0.0, 0])[1]
        gc.collect()
        seconds, calls = phase_timer.TOTALS["gc.2"]
        assert calls == before + 1 and seconds > 0
        cpu_seconds, cpu_calls = phase_timer.TOTALS["gc.2" + phase_timer.CPU]
        assert cpu_calls == calls and 0 < cpu_seconds <= seconds + 0.005  # (a full pass is the thread's own work)
        gc.collect(0)
        assert phase_timer.TOTALS["gc.0"][1] >= 1
    finally:
        gc.callbacks.remove(phase_timer._gc_pass)


def test_a_phase_timed_by_mode_adds_each_call_to_its_batch_s_mode_too() -> None:
    import enum
    import types

    class Mode(enum.Enum):
        EXTEND = 1
        DECODE = 2

    class Runner:
        def forward(self, batch: object) -> object:
            return batch

    class Plain:
        def forward(self, batch: object) -> object:
            return batch

    assert phase_timer.wrap_method(Runner, "forward", "fwd", by_mode=True)
    assert phase_timer.wrap_method(Plain, "forward", "plain")
    extend, decode = types.SimpleNamespace(forward_mode=Mode.EXTEND), types.SimpleNamespace(forward_mode=Mode.DECODE)
    for batch in (extend, decode, decode):
        assert Runner().forward(batch) is batch
        Plain().forward(batch)
    Runner().forward(batch=decode)  # (passed by keyword)
    Runner().forward(object())  # no mode
    assert phase_timer.TOTALS["fwd"][1] == 5
    assert phase_timer.TOTALS["fwd/extend"][1] == 1 and phase_timer.TOTALS["fwd/extend@cpu"][1] == 1
    assert phase_timer.TOTALS["fwd/decode"][1] == 3
    assert phase_timer.TOTALS["fwd/other"][1] == 1
    split = sum(phase_timer.TOTALS[f"fwd/{m}"][0] for m in ("extend", "decode", "other"))
    assert split == pytest.approx(phase_timer.TOTALS["fwd"][0])
    # control: a phase timed without by_mode is not split
    assert phase_timer.TOTALS["plain"][1] == 3 and not any(k.startswith("plain/") for k in phase_timer.TOTALS)
