"""CI-sized leak fuzzing against the real server (the long run is benchmark/leak_fuzz.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso_testing.leak_fuzzer import LeakFuzzer, server_flags, shared_prefix_ids, write_tenants

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
