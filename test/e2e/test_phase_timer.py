"""The phase timer times the real schedulers of both servers of a benchmark, sglang-iso's own phases where they run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing import phase_timer
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port

from .conftest import CPU_SIZES, start_iso_server
from .helpers import auth, generate, write_tenants_file

pytestmark = pytest.mark.e2e

PROMPT = "phase timer " * 40
REQUESTS = 3


def _state(server: ServerProcess, headers: dict[str, str]) -> dict[str, Any]:
    status, info = server.get_with("/get_server_info", headers)
    assert status == 200, info
    state: dict[str, Any] = info["internal_states"][0]
    return state


def _phases(server: ServerProcess, headers: dict[str, str]) -> dict[str, list[float]]:
    totals: dict[str, list[float]] = _state(server, headers)[phase_timer.KEY]
    return totals


def test_both_servers_report_their_phases_and_only_sglang_iso_runs_its_own(tmp_path: Path) -> None:
    keys = {"acme": new_api_key(), "admin": new_api_key()}
    port = free_port()
    env = phase_timer.plugin_env()
    upstream = ServerProcess(baseline_server_argv(port, tiny_model_path(), *CPU_SIZES), port, env=env)
    iso = start_iso_server("--tenants-file", str(write_tenants_file(tmp_path, keys)), env=env)
    got: dict[str, dict[str, tuple[float, int]]] = {}
    frozen: dict[str, int] = {}
    for name, server, info_headers, tenant in (
        ("upstream", upstream, {}, None),
        ("iso", iso, auth(keys["admin"]), keys["acme"]),
    ):
        try:
            server.start()
            if tenant is None:
                # With the warm-up skipped, upstream's own freeze call races the server's listening and can
                # fail: the benchmarks freeze it as upstream does after its warm-up (sglang-iso's gate froze its own).
                server.freeze_gc()
            frozen[name] = _state(server, info_headers)[phase_timer.FROZEN_KEY]
            before = _phases(server, info_headers)
            for _ in range(REQUESTS):
                if tenant is None:
                    status, out = server.post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}})
                    assert status == 200, out
                else:
                    assert generate(server, tenant, PROMPT)["completion_tokens"] >= 1
            got[name] = phase_timer.per_step(before, _phases(server, info_headers))
        finally:
            server.stop()
    for name, phases in got.items():
        steps = phases[phase_timer.STEP][1]
        assert steps >= 3, (name, phases)  # at least one prefill and the decode steps of each request
        forward, model = phases["model_runner.forward"][0], phases["model_runner._forward_raw"][0]
        assert 0 < model <= forward <= phases[phase_timer.STEP][0], (name, phases)
        assert phases["tree.match_prefix"][1] >= 3, (name, phases)
        assert phases["ingest_requests"][1] >= steps, (name, phases)  # (once per loop turn, busy or not)
        # each phase's CPU twin: the scheduler thread's own CPU, never more than the wall time around it
        cpu = phase_timer.CPU
        assert phases[phase_timer.STEP + cpu][1] == steps, (name, phases)
        assert 0 < phases["model_runner._forward_raw" + cpu][0] <= model + 0.01, (name, phases)
        # per forward mode: the prefill and decode steps add up to the steps, and each runs at least once
        by_mode = {m: phases[f"{phase_timer.STEP}/{m}"][1] for m in ("extend", "decode") if f"run_batch/{m}" in phases}
        assert by_mode.get("extend", 0) >= 1 and by_mode.get("decode", 0) >= 1, (name, phases)
        assert sum(by_mode.values()) == steps, (name, phases)
        assert phases["model_runner.forward/extend"][1] == by_mode["extend"], (name, phases)
    checked = got["iso"]
    assert checked["owner_check"][1] == checked[phase_timer.STEP][1]  # before every forward
    # its parts on the host route: every check reads the batch there; a decode step is decided from its new column
    # (the rows recorded at prefill) or the windows are read in full, inside the check's own time
    assert checked["owner_check.host"][1] == checked["owner_check"][1], checked
    assert checked["owner_check.rows_host"][1] >= 1 and checked["owner_check.decode_verified"][1] >= 1, checked
    assert checked["owner_check.host"][0] <= checked["owner_check"][0], checked
    assert checked["owner_check" + phase_timer.CPU][1] == checked["owner_check"][1], checked
    assert not any(p.startswith(("owner_check", "scrub")) for p in got["upstream"]), got["upstream"]
    assert min(frozen.values()) > 100_000, frozen  # SGLang's start-up heap, out of the collector's reach in both
