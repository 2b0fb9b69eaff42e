"""The CPU KV pool size the launcher picks (no server started)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso.server.args import plan_launch
from sglang_iso.server.cpu_pool import (
    CPU_POOL_MAX_TOKENS,
    CPU_RUNNING_REQUESTS,
    FALLBACK_CONTEXT_LEN,
    cpu_pool_flags,
    model_context_len,
)


def _value(argv: list[str], flag: str) -> int:
    return int(argv[argv.index(flag) + 1])


def _model(tmp_path: Path, config: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_pool_fits_the_bundled_models_context_and_running_requests() -> None:
    model = str(tiny_model_path())
    context = json.loads((tiny_model_path() / "config.json").read_text())["max_position_embeddings"]
    plan = plan_launch(["--model-path", model], cuda_available=False)
    argv = plan.sglang_argv
    assert _value(argv, "--max-total-tokens") == context * CPU_RUNNING_REQUESTS
    assert _value(argv, "--max-running-requests") == CPU_RUNNING_REQUESTS
    assert "--max-total-tokens" in plan.added  # shown in the startup log


def test_user_running_requests_and_context_length_are_used(tmp_path: Path) -> None:
    model = _model(tmp_path, {"max_position_embeddings": 4096})
    flags = cpu_pool_flags(["--model-path", model, "--max-running-requests", "4"])
    assert flags == ["--max-total-tokens", str(4096 * 4)]
    flags = cpu_pool_flags(["--model-path", model, "--context-length=1024", "--max-running-requests", "4"])
    assert flags == ["--max-total-tokens", str(1024 * 4)]


def test_pool_is_capped_but_holds_one_full_request(tmp_path: Path) -> None:
    big = _model(tmp_path, {"text_config": {"max_position_embeddings": 131072}})
    assert _value(cpu_pool_flags(["--model-path", big]), "--max-total-tokens") == CPU_POOL_MAX_TOKENS
    huge = ["--model-path", big, "--context-length", str(4 * CPU_POOL_MAX_TOKENS)]
    assert _value(cpu_pool_flags(huge), "--max-total-tokens") == 4 * CPU_POOL_MAX_TOKENS


@pytest.mark.parametrize("flag", [["--max-total-tokens", "2048"], ["--mem-fraction-static=0.5"]])
def test_user_sizing_wins(flag: list[str]) -> None:
    plan = plan_launch(["--model-path", str(tiny_model_path()), *flag], cuda_available=False)
    assert plan.sglang_argv.count("--max-total-tokens") == (1 if flag[0] == "--max-total-tokens" else 0)
    assert "--max-running-requests" not in plan.sglang_argv


def test_gpu_and_cpu_defaults_off_add_no_pool() -> None:
    for plan in (
        plan_launch(["--model-path", "m"], cuda_available=True),
        plan_launch(["--model-path", "m", "--iso-cpu-defaults", "off"], cuda_available=False),
    ):
        assert "--max-total-tokens" not in plan.sglang_argv


def test_unreadable_config_falls_back(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    assert model_context_len(["--model-path", str(tmp_path)]) == FALLBACK_CONTEXT_LEN
    assert model_context_len(["--model-path", "org/hub-model"]) == FALLBACK_CONTEXT_LEN


def test_bad_numbers_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--max-running-requests"):
        cpu_pool_flags(["--model-path", "m", "--max-running-requests", "0"])
    with pytest.raises(ValueError, match="--context-length"):
        plan_launch(["--model-path", "m", "--context-length", "x"], cuda_available=False)
