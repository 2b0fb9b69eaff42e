"""``benchmark/bench_serving.py``'s reading of paired runs: one ratio per server start."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest

from test.unit.testing.conftest import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_serving", "bench_serving_under_test")


def test_each_round_of_repeats_gives_one_ratio(bench: ModuleType) -> None:
    # two rounds of three pairs: the first start ran slower for sglang-iso, the second faster
    assert bench.per_start([0.90, 0.95, 0.92, 1.04, 1.01, 1.10], 3) == [0.92, 1.04]
    assert bench.per_start([0.97, 1.02], 1) == [0.97, 1.02]


def test_pairs_that_are_not_whole_rounds_are_refused(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="whole rounds"):
        bench.per_start([1.0, 1.0, 1.0], 2)
    with pytest.raises(ValueError, match="whole rounds"):
        bench.per_start([1.0], 0)


def test_interval_is_students_t_on_the_logs(bench: ModuleType) -> None:
    from scipy import stats

    ratios = [0.93, 1.02, 0.97, 1.08, 0.95, 0.99]
    mean, lo, hi = bench.interval(ratios)
    logs = [math.log(x) for x in ratios]
    want = stats.t.interval(0.95, len(logs) - 1, loc=sum(logs) / len(logs), scale=stats.sem(logs))
    assert math.isclose(math.log(lo), want[0]) and math.isclose(math.log(hi), want[1])
    assert lo < mean < hi
    assert math.isclose(mean, math.prod(ratios) ** (1 / len(ratios)))
    # a higher confidence widens it; equal ratios leave no width
    lo99, hi99 = bench.interval(ratios, 0.99)[1:]
    assert lo99 < lo and hi < hi99
    assert bench.interval([1.01, 1.01, 1.01]) == pytest.approx((1.01, 1.01, 1.01))


def test_interval_refuses_what_it_cannot_estimate(bench: ModuleType) -> None:
    for bad in ([1.0], [], [1.0, 0.0]):
        with pytest.raises(ValueError, match="two or more positive"):
            bench.interval(bad)
    assert bench.interval_text([1.0]) == "-"


def test_overall_rows_take_one_sample_per_round(bench: ModuleType) -> None:
    levels = bench.parse_levels("gsp:8,random:8")
    results = {s: {lv: bench.Samples() for lv in levels} for s in bench.SERVERS}
    # two rounds of two repeats; round 1 slower for sglang-iso at both levels, round 2 faster
    for lv, iso in zip(levels, ([9, 9.5, 11, 11], [8, 8, 12, 12]), strict=True):
        results["upstream"][lv].throughput = [10.0] * 4
        results["iso"][lv].throughput = [float(x) for x in iso]
        results["upstream"][lv].p99s = [1.0] * 4
        results["iso"][lv].p99s = [1.0] * 4
    rows = bench.overall_rows(results, levels, repeats=2)
    throughput = rows[0].split("|")
    per_round = [float(x) for x in throughput[6].split(",")]
    assert per_round == pytest.approx([math.sqrt(0.925 * 0.8), math.sqrt(1.1 * 1.2)], abs=0.005)
    assert "over 2 rounds" in throughput[2]
    assert rows[1].split("|")[5].strip().startswith("1.000 (1.000-1.000)")


def test_a_control_run_starts_plain_upstream_in_both_slots(bench: ModuleType, tmp_path: Path) -> None:
    tenants = bench.write_tenants(tmp_path)
    iso = bench.BenchServer("iso", tenants, tmp_path)
    control = bench.BenchServer("iso", tenants, tmp_path, control=True)
    upstream = bench.BenchServer("upstream", tenants, tmp_path)
    try:
        # positive control: without --control the second slot is sglang-iso with the tenants file and its keys
        assert "sglang_iso.launch_server" in iso.server.argv and str(tenants.path) in iso.server.argv and iso.iso
        for server in (control, upstream):
            argv = server.server.argv
            assert "sglang_iso.baseline_server" in argv and str(tenants.path) not in argv and not server.iso, argv
            assert server.info_headers == {}
    finally:
        for server in (iso, control, upstream):
            server.stop()
