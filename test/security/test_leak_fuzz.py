"""CI-sized leak fuzzing against the real server (the long run is benchmark/leak_fuzz.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso_testing.leak_fuzzer import server_flags, write_tenants
from sglang_iso_testing.tiny_deepseek import write_tiny_deepseek
from sglang_iso_testing.tiny_nemotron_h import write_tiny_nemotron_h
from sglang_iso_testing.tiny_qwen3_next import SERVE_FLAGS as QWEN3_NEXT_FLAGS
from sglang_iso_testing.tiny_qwen3_next import write_tiny_qwen3_next
from sglang_iso_testing.tiny_swa import DTYPE_FLAGS, write_tiny_swa

from ..e2e.conftest import start_iso_server
from .oracles import assert_clean_run, fuzz_on

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("seed", [1])
def test_seeded_multi_tenant_workload_leaks_nothing(tmp_path: Path, seed: int) -> None:
    tenants_file, tenants, admin = write_tenants(tmp_path)
    server = start_iso_server(*server_flags(tenants_file))
    run = fuzz_on(server, tenants, admin, seed=seed, ops=120, max_seconds=300)
    assert_clean_run(run.report, run.problems, min_requests=60)
    assert run.report.adapter_hits > 0, "positive control: same-owner, same-adapter reuse must happen"
    assert run.report.adapter_refusals > 0, run.report


def test_fuzzed_workload_on_an_mla_moe_model_leaks_nothing(tmp_path: Path) -> None:
    """The same workload (without adapters) on a tiny DeepSeek-V3-shaped model: MLA latent pool, MoE layer."""
    tenants_file, tenants, admin = write_tenants(tmp_path, lora=False)
    model = write_tiny_deepseek(tmp_path / "tiny-deepseek")
    server = start_iso_server(*server_flags(tenants_file, lora=False), model=model)
    run = fuzz_on(server, tenants, admin, seed=2, ops=80, max_seconds=200)
    assert_clean_run(run.report, run.problems, min_requests=40)
    assert run.tree["kv_pool"] == "MLATokenToKVPool" and run.tree["owner_violations"] == 0, run.tree


def test_fuzzed_workload_on_a_sliding_window_hybrid_leaks_nothing(tmp_path: Path) -> None:
    """The same workload (with t2's quota; without adapters or shared prefixes) on a tiny Laguna-shaped model:
    sliding and full attention layers in turn, in SGLang's SWA sub-pool layout (``--iso-swa-layout sub-pool``, Triton
    in its interpreter): the hybrid tree with its SWA component, both sub-pools scrubbed and owner-checked. (The
    one-pool layout, the launcher's default, is the dense pool of the first test; ``test/e2e/test_swa.py`` serves
    it.)"""
    tenants_file, tenants, admin = write_tenants(tmp_path, lora=False, shared=False)
    model = write_tiny_swa(tmp_path / "tiny-swa")
    flags = (*server_flags(tenants_file, lora=False), *DTYPE_FLAGS, "--attention-backend", "triton",
             "--iso-swa-layout", "sub-pool")  # fmt: skip
    server = start_iso_server(*flags, model=model, env={"TRITON_INTERPRET": "1"})
    run = fuzz_on(server, tenants, admin, seed=3, ops=60, max_seconds=75)
    assert_clean_run(run.report, run.problems, min_requests=16)
    assert run.tree["kv_pool"] == "SWAKVPool" and run.tree["impl"] == "TenantHybridCache", run.tree
    assert run.tree["owner_violations"] == 0 and run.tree["owner_swa_violations"] == 0, run.tree


@pytest.mark.parametrize("family", ["qwen3-next", "nemotron-h"])
def test_fuzzed_workload_on_a_hybrid_linear_attention_model_leaks_nothing(tmp_path: Path, family: str) -> None:
    """The same workload (with t2's quota; without adapters or shared prefixes, which such a server refuses) on a tiny
    Qwen3-Next (GDN layers) and a tiny Nemotron-H (Mamba2 layers): recurrent state snapshots on the hybrid tree.
    Reuses continue whole exchanges (prompt and reply), where the state is cached."""
    tenants_file, tenants, admin = write_tenants(tmp_path, lora=False, shared=False)
    write = write_tiny_qwen3_next if family == "qwen3-next" else write_tiny_nemotron_h
    model = write(tmp_path / f"tiny-{family}")
    flags = [f for f in QWEN3_NEXT_FLAGS if f not in ("--mamba-radix-cache-strategy", "no_buffer")]  # the launcher's
    server = start_iso_server(*server_flags(tenants_file, lora=False), *flags, model=model)
    run = fuzz_on(server, tenants, admin, seed=4, ops=80, max_seconds=70, conversations=True)
    assert_clean_run(run.report, run.problems, min_requests=16)
    assert run.tree["impl"] == "TenantHybridCache" and run.tree["owner_violations"] == 0, run.tree
    assert run.tree["state_scrubbed_slots"] > 0, run.tree
