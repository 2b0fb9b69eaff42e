"""DP helpers: stable tenant -> rank, CPU thread binding per rank, and the launcher's env default."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from sglang_iso.server.args import plan_launch
from sglang_iso.server.dp import CPU_BIND_ENV, cpu_threads_bind, tenant_rank, world_size


def test_tenant_rank_is_stable_in_range_and_spreads() -> None:
    owners = [f"tenant-{i}" for i in range(200)]
    ranks = [tenant_rank(o, 2) for o in owners]
    assert ranks == [tenant_rank(o, 2) for o in owners]  # stable
    assert set(ranks) == {0, 1}
    assert min(Counter(tenant_rank(o, 4) for o in owners).values()) > 20  # every rank gets tenants
    assert all(tenant_rank(o, 1) == 0 for o in owners)
    with pytest.raises(ValueError, match="dp_size"):
        tenant_rank("a", 0)


def test_world_size_reads_every_alias() -> None:
    assert world_size(["--model-path", "m"]) == 1
    assert world_size(["--dp-size", "2", "--tensor-parallel-size=3", "--pp-size", "2"]) == 12
    with pytest.raises(ValueError, match="--dp-size"):
        world_size(["--data-parallel-size", "zero"])


@pytest.mark.parametrize(
    ("ranks", "cpus", "want"),
    [
        (1, [0, 1], None),
        (2, [0, 1], "0|1"),
        (2, [0, 1, 2, 3, 4], "0-2|3-4"),
        (2, [0, 2, 4, 6], "0,2|4,6"),
        (3, [5], "5|5|5"),
    ],
)
def test_cpu_threads_bind(ranks: int, cpus: list[int], want: str | None) -> None:
    assert cpu_threads_bind(ranks, cpus) == want


def test_launcher_sets_cpu_binding_for_dp_on_cpu_only_when_unset() -> None:
    plan = plan_launch(["--model-path", "m", "--dp-size", "2"], cuda_available=False, env={})
    added = dict(plan.env_added)
    assert added[CPU_BIND_ENV].count("|") == 1
    assert cpu_threads_bind(2, os.sched_getaffinity(0)) == added[CPU_BIND_ENV]
    user = plan_launch(["--model-path", "m", "--dp-size", "2"], cuda_available=False, env={CPU_BIND_ENV: "0|0"})
    assert user.env_added == ()
    assert plan_launch(["--model-path", "m", "--dp-size", "2"], cuda_available=True, env={}).env_added == ()
    assert plan_launch(["--model-path", "m"], cuda_available=False, env={}).env_added == ()
