"""``benchmark/bench_serving.py``'s reading of paired runs: one ratio per server start."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark" / "bench_serving.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_serving_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses resolve their module by name)
    spec.loader.exec_module(module)
    return module


def test_each_round_of_repeats_gives_one_ratio(bench: ModuleType) -> None:
    # two rounds of three pairs: the first start ran slower for sglang-iso, the second faster
    assert bench.per_start([0.90, 0.95, 0.92, 1.04, 1.01, 1.10], 3) == [0.92, 1.04]
    assert bench.per_start([0.97, 1.02], 1) == [0.97, 1.02]


def test_pairs_that_are_not_whole_rounds_are_refused(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="whole rounds"):
        bench.per_start([1.0, 1.0, 1.0], 2)
    with pytest.raises(ValueError, match="whole rounds"):
        bench.per_start([1.0], 0)
