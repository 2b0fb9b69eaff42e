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


def test_every_second_forward_waits_and_each_half_is_timed_apart() -> None:
    starts: list[float] = []

    def forward(_runner: object, batch: Any) -> str:
        starts.append(time.perf_counter())
        return batch.forward_mode.name

    wrapped = forward_gap.alternating(forward, 20_000)
    before = time.perf_counter()
    assert wrapped(None, _batch("decode")) == "DECODE"  # the forward's answer passes through
    assert wrapped(None, _batch("decode")) == "DECODE"
    wrapped(None, _batch("extend"))
    wrapped(None, _batch("extend"))
    # the first call of each pair runs at once, the second after the hold
    assert starts[0] - before < 0.015
    assert starts[1] - starts[0] >= 0.02
    assert starts[3] - starts[2] >= 0.02
    assert {k: row[2] for k, row in forward_gap.TOTALS.items()} == {
        "decode/none": 1, "decode/gap": 1, "extend/none": 1, "extend/gap": 1,
    }  # fmt: skip
    # the hold is before the forward, not in its time
    assert forward_gap.TOTALS["decode/gap"][0] < 0.015


def test_cost_needs_both_halves_between_the_reports() -> None:
    before = {"decode/none": [1.0, 0.5, 10], "decode/gap": [2.0, 1.0, 10]}
    after = {"decode/none": [1.3, 0.8, 110], "decode/gap": [2.5, 1.4, 110]}
    cost = forward_gap.cost(before, after, "decode")
    assert cost == pytest.approx(
        {"gap_wall_ms": 5.0, "gap_cpu_ms": 4.0, "gap_forwards": 100, "none_wall_ms": 3.0, "none_cpu_ms": 3.0,
         "none_forwards": 100}
    )  # fmt: skip
    assert forward_gap.cost(before, before, "decode") is None
    assert forward_gap.cost(before, after, "extend") is None


@pytest.mark.parametrize("raw", ["-5", "1.5", "ten", " 3"])
def test_a_bad_gap_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(envvars.FORWARD_GAP_US.name, raw)
    with pytest.raises(ValueError, match=envvars.FORWARD_GAP_US.name):
        forward_gap.gap_us()
    monkeypatch.setenv(envvars.FORWARD_GAP_US.name, "300")  # positive control
    assert forward_gap.gap_us() == 300


def test_the_table_reads_the_difference_over_the_gap() -> None:
    bench = load_benchmark("forward_gap")
    result = {
        "gap_us": 500,
        "decode": {"gap_wall_ms": 5.2, "gap_cpu_ms": 5.1, "gap_forwards": 40, "none_wall_ms": 5.0,
                   "none_cpu_ms": 5.0, "none_forwards": 40},
        "extend": None,
    }  # fmt: skip
    (row,) = bench.rows(result)
    assert row.split(" | ")[1:] == ["decode", "40; 40", "5.000", "5.200", "+0.200", "+0.100", "0.40 |"]
    control = {**result, "gap_us": 0}
    assert bench.rows(control)[0].endswith("| - |")  # gap 0: no share to divide
