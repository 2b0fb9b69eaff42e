"""The leak fuzzer with the hierarchical cache on: host tier (L2) and L3 files under constant eviction."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso.server.hicache_args import UPSTREAM_DIR_ENV
from sglang_iso_testing.leak_fuzzer import LeakFuzzer, server_flags, shared_prefix_ids, write_tenants

from ..e2e.conftest import start_iso_server
from .oracles import assert_clean_run

pytestmark = pytest.mark.e2e


def test_fuzzed_workload_with_host_and_file_tiers_leaks_nothing(tmp_path: Path) -> None:
    tenants_file, tenants, admin = write_tenants(tmp_path)
    flags = (*server_flags(tenants_file), "--enable-hierarchical-cache", "--hicache-storage-backend", "file")
    server = start_iso_server(*flags, env={UPSTREAM_DIR_ENV: str(tmp_path / "l3")})
    try:
        server.start()
        fuzzer = LeakFuzzer(server, tenants, admin, shared_prefix_ids(tiny_model_path()), seed=2)
        report = fuzzer.run(ops=80, max_seconds=240)
        problems = fuzzer.final_checks()
        status, out = server.get_with("/iso/tenants", fuzzer.auth(admin))
        status_info, info = server.get_with("/get_server_info", fuzzer.auth(admin))
    finally:
        server.stop()
    assert_clean_run(report, problems, min_requests=40)
    assert status == 200 and status_info == 200
    rows = [r for t in out["tenants"].values() for r in t["ranks"] if r]
    assert sum(r.get("host_resident_tokens", 0) + r.get("host_loaded_tokens", 0) for r in rows) > 0, rows
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    assert tree["host_violations"] == 0 and tree["l3_bad_files"] == 0, tree
    assert tree["l3_written_pages"] > 0, tree
