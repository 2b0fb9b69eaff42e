"""The in-process soak, CI-sized: clean runs find nothing and see same-tenant reuse; each planted fault is found.
The page-ownership table runs inside (every request's row checked, the table compared with the tree).

The long run is ``benchmark/soak.py`` (a million operations)."""

from __future__ import annotations

import pytest

from sglang_iso_testing.soak import Soak, SoakConfig


@pytest.mark.parametrize(
    "config",
    [
        SoakConfig(seed=1, tenants=32, check_every=500),
        SoakConfig(seed=2, tenants=8, page_size=4, pool_tokens=4096, check_every=500),
        SoakConfig(seed=3, tenants=8, page_size=4, pool_tokens=4096, host_tokens=2048, check_every=500),
    ],
    ids=["page1", "page4", "page4-host-tier"],
)
def test_a_clean_run_finds_nothing_and_reuses(config: SoakConfig) -> None:
    soak = Soak(config)
    result = soak.run(1500)  # NOTE: the scrub runs its Triton kernel under the interpreter in tests
    assert result.failure is None, result.failure
    tenant_pages = soak.page_owners.page_owner > soak.page_owners.zero_owner
    assert int(tenant_pages.sum()) > 0 and soak.page_owners.violations == 0  # the ownership check ran on every request
    assert result.hit_tokens > 0 and result.matched_requests > 0  # positive control: same-tenant reuse happened
    assert result.checks >= 3 and result.verified_slots > result.hit_tokens  # the periodic checks verified again
    assert result.evictions > 0 and result.flushes > 0 and result.counts.get("finish", 0) > 0


@pytest.mark.parametrize(
    ("plant", "found"),
    [("double_hand", "isolation violations"), ("overwrite", "holds tenant t00001's data")],
)
def test_a_planted_fault_is_found_with_a_replay(plant: str, found: str) -> None:
    config = SoakConfig(seed=3, tenants=16, plant=plant)
    result = Soak(config).run(3000)
    assert result.failure is not None and found in result.failure, result.failure
    assert "--seed 3 --tenants 16" in result.failure and f"--plant {plant}" in result.failure
    replay = Soak(config).run(result.ops)  # the replay command's run fails the same way
    assert replay.failure is not None and replay.failure.split("\n")[0] == result.failure.split("\n")[0]
