"""The leak fuzzer with EAGLE speculative decoding: pair-keyed tree, draft KV sharing the target's slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso_testing.eagle_head import write_eagle_head
from sglang_iso_testing.leak_fuzzer import LeakFuzzer, server_flags, shared_prefix_ids, write_tenants

from ..e2e.conftest import start_iso_server
from .oracles import assert_clean_run

pytestmark = pytest.mark.e2e


def test_fuzzed_workload_with_eagle_leaks_nothing(tmp_path: Path) -> None:
    tenants_file, tenants, admin = write_tenants(tmp_path)
    head = write_eagle_head(tmp_path / "eagle-head", echo=True)
    flags = (
        *server_flags(tenants_file), "--attention-backend", "triton", "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", str(head), "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
    )  # fmt: skip
    server = start_iso_server(*flags, env={"TRITON_INTERPRET": "1"})
    try:
        server.start(timeout_s=400)
        fuzzer = LeakFuzzer(server, tenants, admin, shared_prefix_ids(tiny_model_path()), seed=3)
        report = fuzzer.run(ops=80, max_seconds=300)
        problems = fuzzer.final_checks()
        status, info = server.get_with("/get_server_info", fuzzer.auth(admin))
    finally:
        server.stop()
    assert_clean_run(report, problems, min_requests=40)
    assert status == 200
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    assert tree["draft_buffers"] > 0 and tree["owner_draft_step_checks"] > 0, tree  # the draft model ran, checked
    assert tree["owner_violations"] == 0, tree
