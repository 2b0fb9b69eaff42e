"""CI-sized leak fuzzing against the real server (the long run is benchmark/leak_fuzz.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso_testing.leak_fuzzer import LeakFuzzer, server_flags, shared_prefix_ids, write_tenants
from sglang_iso_testing.tiny_deepseek import write_tiny_deepseek

from ..e2e.conftest import start_iso_server
from .oracles import assert_clean_run

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("seed", [1])
def test_seeded_multi_tenant_workload_leaks_nothing(tmp_path: Path, seed: int) -> None:
    tenants_file, tenants, admin = write_tenants(tmp_path)
    server = start_iso_server(*server_flags(tenants_file))
    try:
        server.start()
        fuzzer = LeakFuzzer(server, tenants, admin, shared_prefix_ids(tiny_model_path()), seed)
        report = fuzzer.run(ops=120, max_seconds=300)
        problems = fuzzer.final_checks()
    finally:
        server.stop()
    assert_clean_run(report, problems, min_requests=60)
    assert report.adapter_hits > 0, "positive control: same-owner, same-adapter reuse must happen"
    assert report.adapter_refusals > 0, report


def test_fuzzed_workload_on_an_mla_moe_model_leaks_nothing(tmp_path: Path) -> None:
    """The same workload (without adapters) on a tiny DeepSeek-V3-shaped model: MLA latent pool, MoE layer."""
    tenants_file, tenants, admin = write_tenants(tmp_path, lora=False)
    model = write_tiny_deepseek(tmp_path / "tiny-deepseek")
    server = start_iso_server(*server_flags(tenants_file, lora=False), model=model)
    try:
        server.start()
        fuzzer = LeakFuzzer(server, tenants, admin, shared_prefix_ids(tiny_model_path()), seed=2)
        report = fuzzer.run(ops=80, max_seconds=200)
        problems = fuzzer.final_checks()
        status, info = server.get_with("/get_server_info", fuzzer.auth(admin))
    finally:
        server.stop()
    assert_clean_run(report, problems, min_requests=40)
    assert status == 200
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    assert tree["kv_pool"] == "MLATokenToKVPool" and tree["owner_violations"] == 0, tree
