"""The leak fuzzer with the hierarchical cache on: host tier (L2) and L3 files under constant eviction."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso.server.hicache_args import UPSTREAM_DIR_ENV
from sglang_iso_testing.leak_fuzzer import server_flags, write_tenants

from ..e2e.conftest import start_iso_server
from .oracles import assert_clean_run, fuzz_on

pytestmark = pytest.mark.e2e


def test_fuzzed_workload_with_host_and_file_tiers_leaks_nothing(tmp_path: Path) -> None:
    tenants_file, tenants, admin = write_tenants(tmp_path)
    flags = (*server_flags(tenants_file), "--enable-hierarchical-cache", "--hicache-storage-backend", "file")
    server = start_iso_server(*flags, env={UPSTREAM_DIR_ENV: str(tmp_path / "l3")})
    run = fuzz_on(server, tenants, admin, seed=2, ops=80, max_seconds=240)
    assert_clean_run(run.report, run.problems, min_requests=40)
    out, tree = run.tenants, run.tree
    rows = [r for t in out["tenants"].values() for r in t["ranks"] if r]
    assert sum(r.get("host_resident_tokens", 0) + r.get("host_loaded_tokens", 0) for r in rows) > 0, rows
    assert tree["host_violations"] == 0 and tree["l3_bad_files"] == 0, tree
    assert tree["l3_written_pages"] > 0, tree
