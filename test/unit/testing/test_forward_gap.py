"""The forward-gap plugin holds every second forward, splits the timings by mode and gap, and reads its setting
strictly; benchmark/forward_gap.py turns two reports into its table."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_iso import envvars
from sglang_iso_testing import forward_gap
from test.unit.testing.conftest import load_benchmark


@pytest.fixture(autouse=True)
def _fresh_totals() -> Iterator[None]:
    saved = dict(forward_gap.TOTALS)
    forward_gap.TOTALS.clear()
    yield
    forward_gap.TOTALS.clear()
    forward_gap.TOTALS.update(saved)


def _batch(mode: str) -> Any:
    return SimpleNamespace(forward_mode=SimpleNamespace(name=mode.upper()))


def test_every_second_forward_waits_and_each_half_is_timed_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(forward_gap, "hold", lambda us, buffer: events.append(f"hold {us} {buffer is not None}"))

    def forward(_runner: object, batch: Any) -> str:
        events.append("forward")
        return batch.forward_mode.name

    wrapped = forward_gap.alternating(forward, 250, kilobytes=4)
    assert wrapped(None, _batch("decode")) == "DECODE"  # the forward's answer passes through
    assert wrapped(None, _batch("decode")) == "DECODE"
    wrapped(None, _batch("extend"))
    wrapped(None, batch=_batch("extend"))  # (the batch by keyword too)
    # the first call of each pair runs at once, the second after the hold, over the buffer asked for
    assert events == ["forward", "hold 250 True", "forward", "forward", "hold 250 True", "forward"]
    assert {k: row[2] for k, row in forward_gap.TOTALS.items()} == {
        "decode/none": 1, "decode/gap": 1, "extend/none": 1, "extend/gap": 1, "hold": 2,
    }  # fmt: skip


def test_the_hold_is_timed_apart_from_the_forward_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock that only the hold (20 ms) and the forward (1 ms) move: each is counted where it belongs."""
    now = [0.0]
    clock = SimpleNamespace(perf_counter=lambda: now[0], thread_time=lambda: now[0])
    monkeypatch.setattr(forward_gap, "time", clock)

    def forward(_runner: object, _batch: Any) -> None:
        now[0] += 0.001

    monkeypatch.setattr(forward_gap, "hold", lambda us, _buffer: now.__setitem__(0, now[0] + us / 1e6))
    wrapped = forward_gap.alternating(forward, 20_000)
    wrapped(None, _batch("decode"))
    wrapped(None, _batch("decode"))
    assert forward_gap.TOTALS["hold"][0] == pytest.approx(0.02)
    assert forward_gap.TOTALS["decode/gap"][:2] == pytest.approx([0.001, 0.001])
    assert forward_gap.TOTALS["decode/none"][:2] == pytest.approx([0.001, 0.001])


def test_a_hold_over_a_buffer_writes_all_of_it_and_lasts_the_gap() -> None:
    buffer = bytearray(10_000)  # (not a whole number of pages: the last one is cut to fit)
    start = time.perf_counter()
    forward_gap.hold(5_000, buffer)
    assert time.perf_counter() - start >= 0.005
    assert buffer == b"\x01" * 10_000
    untouched = bytearray(3)
    forward_gap.hold(0, untouched)  # a zero gap still writes it once
    assert untouched == b"\x01" * 3


def test_cost_needs_both_halves_between_the_reports() -> None:
    before = {"decode/none": [1.0, 0.5, 10], "decode/gap": [2.0, 1.0, 10], "hold": [0.1, 0.0, 10]}
    after = {"decode/none": [1.3, 0.8, 110], "decode/gap": [2.5, 1.4, 110], "hold": [0.13, 0.0, 110]}
    cost = forward_gap.cost(before, after, "decode")
    assert cost == pytest.approx(
        {"gap_wall_ms": 5.0, "gap_cpu_ms": 4.0, "gap_forwards": 100, "none_wall_ms": 3.0, "none_cpu_ms": 3.0,
         "none_forwards": 100, "hold_ms": 0.3}
    )  # fmt: skip
    assert forward_gap.cost(before, before, "decode") is None
    assert forward_gap.cost(before, after, "extend") is None


@pytest.mark.parametrize("raw", ["-5", "1.5", "ten", " 3", "\u0663"])
@pytest.mark.parametrize("var", [envvars.FORWARD_GAP_US, envvars.FORWARD_GAP_KB])
def test_a_bad_setting_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: envvars.EnvVar, raw: str
) -> None:
    read = forward_gap.gap_us if var is envvars.FORWARD_GAP_US else forward_gap.gap_kb
    monkeypatch.setenv(var.name, raw)
    with pytest.raises(ValueError, match=var.name):
        read()
    monkeypatch.setenv(var.name, "300")  # positive control
    assert read() == 300


def test_the_table_reads_the_difference_over_the_gap() -> None:
    bench = load_benchmark("forward_gap")
    result = {
        "gap_us": 500, "gap_kb": 64,
        "decode": {"gap_wall_ms": 5.2, "gap_cpu_ms": 5.1, "gap_forwards": 40, "none_wall_ms": 5.0,
                   "none_cpu_ms": 5.0, "none_forwards": 40, "hold_ms": 0.5},
    }  # fmt: skip
    (row,) = bench.rows(result)
    cells = ["| 500, 64 KB", "500", "decode", "40; 40", "5.000", "5.200", "+0.200", "+0.100", "0.40 |"]
    assert row.split(" | ") == cells
    control = {"gap_us": 0, "gap_kb": 0, "decode": {**result["decode"], "hold_ms": 0.007}}
    assert bench.rows(control)[0].startswith("| 0 | 7 |")
    assert bench.rows(control)[0].endswith("| - |")  # the control's few microseconds of hold are not divided by
    assert bench.parse_gap("300") == (300, 0)
    assert bench.parse_gap("300:4096") == (300, 4096)
