"""The launcher's flag handling (no server started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_iso.server.args import plan_launch


def test_cpu_defaults_and_tenant_backend_added_without_cuda() -> None:
    plan = plan_launch(["--model-path", "m"], cuda_available=False)
    argv = plan.sglang_argv
    assert argv[:2] == ["--model-path", "m"]
    assert argv[argv.index("--radix-cache-backend") + 1] == "tenant"
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--attention-backend") + 1] == "torch_native"
    assert "--disable-cuda-graph" in argv


def test_gpu_gets_no_cpu_defaults() -> None:
    plan = plan_launch(["--model-path", "m"], cuda_available=True)
    assert plan.sglang_argv == ["--model-path", "m", "--radix-cache-backend", "tenant", "--disable-hybrid-swa-memory"]


def test_user_flags_win_over_defaults() -> None:
    plan = plan_launch(
        ["--model-path", "m", "--attention-backend=triton", "--device", "cpu", "--radix-cache-backend", "tenant"],
        cuda_available=False,
    )
    assert plan.sglang_argv.count("--device") == 1
    assert "torch_native" not in plan.sglang_argv
    assert plan.sglang_argv.count("--radix-cache-backend") == 1


def test_cpu_defaults_off() -> None:
    plan = plan_launch(["--model-path", "m", "--iso-cpu-defaults", "off"], cuda_available=False)
    assert plan.sglang_argv == ["--model-path", "m", "--radix-cache-backend", "tenant", "--disable-hybrid-swa-memory"]


def test_the_swa_sub_pool_layout_is_asked_for_by_name() -> None:
    plan = plan_launch(["--model-path", "m", "--iso-swa-layout", "sub-pool"], cuda_available=True)
    assert "--disable-hybrid-swa-memory" not in plan.sglang_argv


def test_hybrid_linear_attention_models_get_the_covered_state_strategy_unless_given(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_next"}))
    plan = plan_launch(["--model-path", str(tmp_path)], cuda_available=True)
    assert plan.sglang_argv[-2:] == ["--mamba-radix-cache-strategy", "no_buffer"]
    assert plan.added[-2:] == ["--mamba-radix-cache-strategy", "no_buffer"]
    dense = plan_launch(["--model-path", "m"], cuda_available=True)  # control: not for a dense model
    assert "--mamba-radix-cache-strategy" not in dense.sglang_argv


def test_hybrid_swa_models_get_the_one_pool_layout_unless_given() -> None:
    """The launcher's default layout for hybrid SWA models is one pool (``--iso-swa-layout sub-pool``: SGLang's)."""
    plan = plan_launch(["--model-path", "m"], cuda_available=True)
    assert plan.sglang_argv.count("--disable-hybrid-swa-memory") == 1 and "--disable-hybrid-swa-memory" in plan.added
    given = plan_launch(["--model-path", "m", "--disable-hybrid-swa-memory"], cuda_available=True)
    assert given.sglang_argv.count("--disable-hybrid-swa-memory") == 1
    assert "--disable-hybrid-swa-memory" not in given.added


@pytest.mark.parametrize("flag", [["--radix-cache-backend", "flexkv"], ["--radix-cache-backend=other"]])
def test_other_backend_refused(flag: list[str]) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        plan_launch(["--model-path", "m", *flag], cuda_available=False)


@pytest.mark.parametrize("backend", ["triton", "flashinfer", "fa3", "torch_native"])
def test_owner_check_accepts_every_attention_backend(backend: str) -> None:
    plan = plan_launch(["--model-path", "m", "--attention-backend", backend], cuda_available=True)
    assert plan.kv_owner_check == "on" and backend in plan.sglang_argv


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--speculative-algorithm", "FROZEN_KV_MTP"], "--speculative-algorithm FROZEN_KV_MTP"),
        (["--speculative-algorithm", "DFLASH"], "--speculative-algorithm DFLASH"),
        (["--dllm-algorithm=LowConfidence"], "--dllm-algorithm LowConfidence"),
    ],
)
def test_owner_check_refuses_what_it_does_not_cover(flags: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        plan_launch(["--model-path", "m", *flags], cuda_available=True)
    plan = plan_launch(["--model-path", "m", *flags, "--kv-owner-check", "off"], cuda_available=True)
    assert plan.kv_owner_check == "off"  # positive control: allowed with the check off


@pytest.mark.parametrize("algorithm", ["NGRAM", "STANDALONE", "standalone", "EAGLE", "EAGLE3", "NEXTN"])
def test_owner_check_allows_covered_speculative_algorithms(algorithm: str) -> None:
    plan = plan_launch(["--model-path", "m", "--speculative-algorithm", algorithm], cuda_available=True)
    assert plan.kv_owner_check == "on"


def test_every_sglang_flag_passes_through_unchanged() -> None:
    user = ["--model-path", "m", "--tp-size", "1", "--mem-fraction-static", "0.5", "--enable-metrics"]
    plan = plan_launch(user, cuda_available=True)
    assert plan.sglang_argv[: len(user)] == user


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_iso.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_dry_run_prints_plan() -> None:
    out = _cli("serve", "--model-path", "m", "--iso-dry-run")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout.strip().splitlines()[-1])
    assert "tenant" in plan["sglang_argv"]


def test_cli_refuses_other_backend_with_exit_2() -> None:
    out = _cli("serve", "--model-path", "m", "--radix-cache-backend", "flexkv")
    assert out.returncode == 2
    assert "--radix-cache-backend" in out.stderr


def test_cli_help_lists_both_groups() -> None:
    out = _cli("serve", "--help")
    assert out.returncode == 0, out.stderr
    assert "sglang-iso:" in out.stdout and "--iso-cpu-defaults" in out.stdout
    assert "--radix-cache-backend" in out.stdout and "--model-path" in out.stdout


def test_tenants_file_skips_warmup_and_refuses_shared_keys() -> None:
    plan = plan_launch(["--model-path", "m", "--tenants-file", "t.toml"], cuda_available=True)
    assert plan.tenants_file is not None and plan.tenants_file.endswith("t.toml")
    assert "--skip-server-warmup" in plan.added
    for flag in (["--api-key", "k"], ["--admin-api-key", "k"], ["--grpc-port", "1"], ["--tokenizer-worker-num", "4"]):
        with pytest.raises(ValueError, match="--tenants-file"):
            plan_launch(["--model-path", "m", "--tenants-file", "t.toml", *flag], cuda_available=True)
    with pytest.raises(ValueError, match="SGLANG_RUST_SERVER"):
        plan_launch(
            ["--model-path", "m", "--tenants-file", "t.toml"], cuda_available=True, env={"SGLANG_RUST_SERVER": "1"}
        )


def test_without_tenants_file_shared_keys_pass_through() -> None:
    plan = plan_launch(["--model-path", "m", "--api-key", "k"], cuda_available=True)
    assert plan.tenants_file is None and "--api-key" in plan.sglang_argv


def test_request_decompression_is_refused_with_tenants() -> None:
    # Bodies decompressed after the gate would reach SGLang unchecked.
    with pytest.raises(ValueError, match="SGLANG_ENABLE_REQUEST_DECOMPRESSION"):
        plan_launch(
            ["--model-path", "m", "--tenants-file", "t.toml"],
            cuda_available=True,
            env={"SGLANG_ENABLE_REQUEST_DECOMPRESSION": "1"},
        )


def test_metrics_auth_defaults_to_admin() -> None:
    plan = plan_launch(["--model-path", "m", "--tenants-file", "t.toml"], cuda_available=True, env={})
    assert plan.metrics_auth == "admin"
    plan = plan_launch(["--model-path", "m", "--iso-metrics-auth", "open"], cuda_available=True, env={})
    assert plan.metrics_auth == "open" and "--iso-metrics-auth" not in plan.sglang_argv


def test_cpu_picks_a_cpu_capable_lora_backend_only_with_lora_on() -> None:
    for lora in (["--enable-lora"], ["--lora-paths", "a=/x"]):
        argv = plan_launch(["--model-path", "m", *lora], cuda_available=False).sglang_argv
        assert argv[argv.index("--lora-backend") + 1] == "torch_native"
    assert "--lora-backend" not in plan_launch(["--model-path", "m"], cuda_available=False).sglang_argv
    assert "--lora-backend" not in plan_launch(["--model-path", "m", "--enable-lora"], cuda_available=True).sglang_argv
    argv = plan_launch(
        ["--model-path", "m", "--enable-lora", "--lora-backend", "triton"], cuda_available=False
    ).sglang_argv
    assert argv.count("--lora-backend") == 1 and argv[argv.index("--lora-backend") + 1] == "triton"


PD = ["--model-path", "m", "--tenants-file", "t.toml"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "nixl"], "backend nixl"),
        (["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "fake"], "backend fake"),
        (["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mori"], "backend mori"),
        (["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "fake"], "backend fake"),
        (["--disaggregation-mode", "encode"], "--disaggregation-mode encode"),
        (["--disaggregation-mode", "decode", "--disaggregation-decode-enable-radix-cache"], "radix-cache"),
        (["--disaggregation-mode", "decode", "--disaggregation-decode-host-receive-threshold", "0.5"], "threshold"),
        (["--disaggregation-mode", "prefill", "--enable-pd-role-switch"], "role-switch"),
        (["--disaggregation-mode", "decode", "--disaggregation-decode-retraction-backup", "host_pool"], "host_pool"),
        (["--disaggregation-mode", "prefill", "--speculative-algorithm", "EAGLE"], "algorithm EAGLE is not"),
        (["--disaggregation-mode", "decode", "--speculative-algorithm", "STANDALONE"], "STANDALONE is not"),
    ],
)
def test_uncovered_disaggregation_is_refused_by_name(argv: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        plan_launch([*PD, "--kv-owner-check", "off", *argv], cuda_available=True)


def test_covered_disaggregation_is_served() -> None:
    for mode, backend in (("prefill", "mooncake_tcp"), ("decode", "mooncake"), ("prefill", "mooncake")):
        argv = [*PD, "--kv-owner-check", "off", "--disaggregation-mode", mode]
        assert plan_launch([*argv, "--disaggregation-transfer-backend", backend], cuda_available=True).sglang_argv
    with pytest.raises(ValueError, match="needs --tenants-file"):
        plan_launch(["--model-path", "m", "--kv-owner-check", "off", "--disaggregation-mode", "prefill"],
                    cuda_available=True)  # fmt: skip
    decode = plan_launch([*PD, "--disaggregation-mode", "decode", "--kv-owner-check", "off"], cuda_available=True)
    assert decode.sglang_argv[decode.sglang_argv.index("--disaggregation-decode-retraction-backup") + 1] == "cpu_tensor"
    prefill = plan_launch([*PD, "--disaggregation-mode", "prefill"], cuda_available=False)
    assert "--disable-overlap-schedule" in prefill.added
    with pytest.raises(ValueError, match="SGLANG_DISAGG_STAGING_BUFFER"):
        plan_launch([*PD, "--disaggregation-mode", "prefill"], cuda_available=True,
                    env={"SGLANG_DISAGG_STAGING_BUFFER": "1"})  # fmt: skip
    assert plan_launch(["--model-path", "m", "--disaggregation-mode", "null"], cuda_available=True).sglang_argv
    ngram = [*PD, "--kv-owner-check", "off", "--disaggregation-mode", "decode", "--speculative-algorithm", "NGRAM"]
    assert plan_launch(ngram, cuda_available=True).sglang_argv  # no draft model: served
