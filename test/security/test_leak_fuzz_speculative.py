"""The leak fuzzer with draft-model speculative decoding (EAGLE, and MTP on an MLA + MoE model): pair-keyed tree,
draft KV sharing the target's slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso_testing.eagle_head import write_eagle_head
from sglang_iso_testing.leak_fuzzer import server_flags, write_tenants
from sglang_iso_testing.tiny_deepseek import DTYPE_FLAGS, MTP_FLAGS, write_tiny_deepseek

from ..e2e.conftest import start_iso_server
from .oracles import assert_clean_run, fuzz_on

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("target", ["llama-eagle", "deepseek-mtp"])
def test_fuzzed_workload_with_a_draft_model_leaks_nothing(tmp_path: Path, target: str) -> None:
    """EAGLE with a seeded head on the bundled model; NEXTN (MTP) with a tiny DeepSeek-V3-shaped MLA + MoE model."""
    lora = target == "llama-eagle"  # NOTE: the fuzzer's adapters are written for the bundled model
    tenants_file, tenants, admin = write_tenants(tmp_path, lora=lora)
    if target == "llama-eagle":
        head = write_eagle_head(tmp_path / "eagle-head", echo=True)
        model, spec = None, [
            "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(head),
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        ]  # fmt: skip
    else:
        model, spec = write_tiny_deepseek(tmp_path / "tiny-deepseek"), [*DTYPE_FLAGS, *MTP_FLAGS]
    flags = (*server_flags(tenants_file, lora=lora), "--attention-backend", "triton", *spec)
    server = start_iso_server(*flags, env={"TRITON_INTERPRET": "1"}, model=model)
    run = fuzz_on(server, tenants, admin, seed=3, ops=24, max_seconds=80, start_timeout_s=400)
    assert_clean_run(run.report, run.problems, min_requests=12)
    tree = run.tree
    assert tree["kv_pool"] == ("MHATokenToKVPool" if lora else "MLATokenToKVPool"), tree
    assert tree["draft_buffers"] > 0 and tree["owner_draft_step_checks"] > 0, tree  # the draft model ran, checked
    assert tree["owner_violations"] == 0, tree
