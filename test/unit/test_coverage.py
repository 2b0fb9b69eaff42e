"""The coverage table: one row per refused feature, the README's list generated from it, both stages agree."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_iso import coverage
from sglang_iso.coverage import Features, Stage, refusals

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_exactly_the_table() -> None:
    text = README.read_text()
    found = re.search(r"<!-- coverage-table -->\n(.*?)\n<!-- /coverage-table -->", text, re.S)
    assert found is not None, "README has no coverage table block"
    assert found.group(1) == coverage.table_markdown()
    assert len({row.feature for row in coverage.ROWS}) == len(coverage.ROWS)  # one name, one row


def test_readme_lists_exactly_the_model_families() -> None:
    found = re.search(r"<!-- family-table -->\n(.*?)\n<!-- /family-table -->", README.read_text(), re.S)
    assert found is not None, "README has no model-family table block"
    assert found.group(1) == coverage.families_markdown()
    assert {"DSATokenToKVPool", "HybridLinearKVPool", "SWAKVPool"} <= coverage.COVERED_POOLS


@pytest.mark.parametrize("pool", sorted(coverage.COVERED_POOLS))
def test_served_pool_classes_pass_and_others_are_refused_by_name(pool: str) -> None:
    assert refusals(Features("scheduler", kv_pool_class=pool)) == []
    found = refusals(Features("scheduler", kv_pool_class=pool + "V2"))
    assert [r.feature for r in found] == ["a KV pool class outside the model-family table"]
    assert f"{pool}V2" in coverage.explain(found)


@pytest.mark.parametrize(
    ("config", "dsa"),
    [
        ({"architectures": ["DeepseekV3ForCausalLM"], "index_topk": 2048}, True),
        ({"architectures": ["GlmMoeDsaForCausalLM"], "index_topk": 2048}, True),
        ({"architectures": ["DeepseekV3ForCausalLM"]}, False),  # MLA, not DSA: served
        ({"architectures": ["LlamaForCausalLM"], "index_topk": 8}, False),
        ({"architectures": "DeepseekV32ForCausalLM", "index_topk": 8}, False),  # not a list: no DSA for SGLang either
        ({}, False),
    ],
)
def test_the_launcher_reads_dsa_from_the_model_config(config: dict, dsa: bool) -> None:
    """A DSA model is refused where SGLang's indexer cannot run (no CUDA, or ``--device cpu``), by name."""
    cpu = Features.from_argv([], {}, kv_owner_check=True, tenants_file=True, model_config=config, cuda_available=False)
    assert cpu.dsa is dsa and cpu.device == "cpu"
    assert [r.feature for r in refusals(cpu)] == (
        ["DSA sparse attention models (GLM-5, DeepSeek-V3.2, ...) on `--device cpu`"] if dsa else []
    )
    if dsa:
        assert "SGLang's DSA indexer has no CPU path" in coverage.explain(refusals(cpu))
    gpu = Features.from_argv([], {}, kv_owner_check=True, tenants_file=True, model_config=config)
    assert refusals(gpu) == []  # served on CUDA: every tensor of its pool is scrubbed
    forced = Features.from_argv(["--device", "cpu"], {}, kv_owner_check=True, tenants_file=True, model_config=config)
    assert bool(refusals(forced)) is dsa


@pytest.mark.parametrize(
    ("extra", "feature"),
    [
        ({"hierarchical_cache": True}, "DSA sparse attention models with `--enable-hierarchical-cache`"),
        ({"disaggregation_mode": "prefill", "tenants_file": True},
         "DSA sparse attention models with `--disaggregation-mode`"),
    ],
)  # fmt: skip
def test_dsa_is_refused_with_tiers_that_do_not_carry_index_keys(extra: dict, feature: str) -> None:
    stages: tuple[Stage, ...] = ("launch", "scheduler")
    for stage in stages:
        assert feature in {r.feature for r in refusals(Features(stage, dsa=True, device="cuda", **extra))}
        assert feature not in {r.feature for r in refusals(Features(stage, device="cuda", **extra))}  # control


def test_every_row_refuses_something_and_the_default_server_nothing() -> None:
    """Each row has a configuration that trips it (so no row is dead), and a plain server trips none."""
    assert refusals(Features("launch")) == [] and refusals(Features("scheduler")) == []
    tripped = set()
    stages: tuple[Stage, ...] = ("launch", "scheduler")
    for stage in stages:
        for f in _probes(stage):
            tripped |= {r.feature for r in refusals(f)}
    assert tripped == {row.feature for row in coverage.ROWS}


def _probes(stage: Stage) -> list[Features]:
    pd = {"disaggregation_mode": "decode", "pd_flags": frozenset(coverage.UNCOVERED_PD_FLAGS)}
    pd_more = {"decode_retraction_backup": "host_pool", "decode_host_receive_threshold": "0.5"}
    hicache = {"hierarchical_cache": True, "storage_backend": "mooncake", "host_memory_mode": "buffer_only"}
    model = {
        "dllm_algorithm": "LowConfidence",
        "hybrid_swa": True,
        "hybrid_ssm": True,
        "dsa": True,
        "attention_sinks": True,
        "attention_backends": frozenset({"torch_native"}),
        "device": "cpu",
        "kv_pool_class": "DSATokenToKVPoolV2",
        "unscrubbed_tensors": frozenset({"DSATokenToKVPoolV2.index_key_cache"}),
        "hybrid_ssm_flags": frozenset(coverage.HYBRID_SSM_FLAGS),
        "mamba_strategy": "extra_buffer",
        "tenant_limits": frozenset(coverage.TENANT_LIMIT_FIELDS),
    }
    bypass = {"bypass_flags": frozenset(coverage.BYPASS_FLAGS), "bypass_env": frozenset(coverage.BYPASS_ENV)}
    return [
        Features(stage, radix_cache_backend="flexkv"),
        Features(stage, disaggregation_mode="encode", tenants_file=True),
        Features(stage, disaggregation_mode="prefill", transfer_backend="nixl", tenants_file=True),
        Features(stage, **pd, **pd_more, speculative_algorithm="EAGLE", dsa=True),  # type: ignore[arg-type]
        Features(stage, storage_backend="file"),
        Features(stage, **hicache, speculative_algorithm="STANDALONE", dsa=True),  # type: ignore[arg-type]
        Features(stage, hierarchical_cache=True, storage_backend="file"),
        Features(stage, speculative_algorithm="DFLASH", **model),  # type: ignore[arg-type]
        Features(stage, tenants_file=True, tokenizer_workers="4", **bypass),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(
    ("argv", "server_args"),
    [
        (["--speculative-algorithm", "FROZEN_KV_MTP"], {"speculative_algorithm": "FROZEN_KV_MTP"}),
        (["--dllm-algorithm", "LowConfidence"], {"dllm_algorithm": "LowConfidence"}),
        (["--disaggregation-mode", "decode"], {"disaggregation_mode": "decode"}),
        (["--disaggregation-mode", "null"], {"disaggregation_mode": "null"}),
    ],
)
def test_both_stages_read_the_same_facts_alike(argv: list[str], server_args: dict[str, str]) -> None:
    """Rows checked at both stages refuse the same features whether read from argv or from ServerArgs."""
    launch = Features.from_argv(argv, {}, kv_owner_check=True, tenants_file=False)
    scheduler = Features.from_server_args(SimpleNamespace(**server_args), kv_owner_check=True, tenants_file=False)
    shared = {row.feature for row in coverage.ROWS if row.stages == ("launch", "scheduler")}
    assert {r.feature for r in refusals(launch)} & shared == {r.feature for r in refusals(scheduler)} & shared


def test_a_speculative_enum_reads_as_its_name() -> None:
    algorithm = SimpleNamespace(name="DFLASH")
    f = Features.from_server_args(SimpleNamespace(speculative_algorithm=algorithm), kv_owner_check=False,
                                  tenants_file=True)  # fmt: skip
    assert "--speculative-algorithm DFLASH" in coverage.explain(refusals(f))


@pytest.mark.parametrize(
    ("config", "ssm"),
    [
        ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}, True),
        ({"model_type": "nemotron_h"}, True),
        ({"model_type": "qwen3_5_vl_wrapper", "text_config": {"model_type": "qwen3_5"}}, True),  # a VL wrapper
        ({"model_type": "NemotronH_Nano_VL_V2", "llm_config": {"model_type": "nemotron_h"}}, True),
        ({"model_type": "granitemoehybrid", "layer_types": ["attention", "mamba"]}, True),
        ({"model_type": "granitemoehybrid", "layer_types": ["attention", "attention"]}, False),  # no Mamba layer
        ({"model_type": "llama"}, False),
        ({"model_type": "laguna"}, False),  # sliding-window hybrid: served in one pool
        ({"text_config": "qwen3_next"}, False),  # not a mapping: nothing to read
        ({}, False),
    ],
)
def test_the_launcher_reads_recurrent_state_from_the_model_config(config: dict, ssm: bool) -> None:
    """A hybrid linear-attention model is served, and refused by name before SGLang starts with a flag the hybrid
    tree does not cover (the same flag with a dense model is not refused by these rows), on any device."""
    argv = ["--enable-streaming-session", "--mamba-radix-cache-strategy", "extra_buffer"]
    for cuda in (True, False):
        plain = Features.from_argv([], {}, kv_owner_check=True, tenants_file=True, model_config=config,
                                   cuda_available=cuda)  # fmt: skip
        assert plain.hybrid_ssm is ssm
        assert refusals(plain) == []
        flagged = Features.from_argv(argv, {}, kv_owner_check=True, tenants_file=True, model_config=config,
                                     cuda_available=cuda)  # fmt: skip
        assert [r.feature for r in refusals(flagged)] == (
            [
                "hybrid SSM/Mamba models or the SWA sub-pool layout with `--enable-streaming-session`",
                "hybrid SSM/Mamba models with `--mamba-radix-cache-strategy` other than `no_buffer`",
            ]
            if ssm
            else []
        )


def test_the_scheduler_reads_hybrid_flags_from_server_args_and_limits_from_the_tenants_file() -> None:
    args = SimpleNamespace(
        disaggregation_mode="null", enable_lora=False, enable_hierarchical_cache=True,
        mamba_radix_cache_strategy="no_buffer",
    )  # fmt: skip
    limits = frozenset({"quota_tokens", "host_quota_tokens", "shared_prefixes"})
    f = Features.from_server_args(args, kv_owner_check=True, tenants_file=True, hybrid_ssm=True,
                                  tenant_limits=limits)  # fmt: skip
    assert f.hybrid_ssm_flags == frozenset({"--enable-hierarchical-cache"})  # "null" and False are off
    message = coverage.explain(refusals(f))
    assert "--enable-hierarchical-cache with hybrid SSM/Mamba models" in message
    assert "tenants-file shared_prefixes with hybrid SSM/Mamba models" in message
    assert "quota_tokens" not in message  # the hybrid tree enforces quotas (its host tier is refused by flag)
    swa = Features.from_server_args(args, kv_owner_check=False, tenants_file=True, hybrid_swa=True,
                                    tenant_limits=limits)  # fmt: skip
    assert "or the SWA sub-pool layout" in coverage.explain(refusals(swa))  # the same hybrid tree
    quota_only = Features.from_server_args(
        SimpleNamespace(**{**vars(args), "enable_hierarchical_cache": False}), kv_owner_check=True,
        tenants_file=True, hybrid_ssm=True, tenant_limits=frozenset({"quota_tokens", "host_quota_tokens"}),
    )  # fmt: skip
    assert refusals(quota_only) == []
    dense = Features.from_server_args(args, kv_owner_check=True, tenants_file=True, tenant_limits=limits)
    assert refusals(dense) == []  # control: the dense tree enforces them


SINKS = "models with attention sinks (gpt-oss) on the torch_native attention backend"
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}


@pytest.mark.parametrize(
    ("config", "argv", "cuda", "refused"),
    [
        (GPT_OSS, [], False, True),  # CPU: the launcher's default backend there is torch_native
        (GPT_OSS, ["--attention-backend", "triton"], False, False),  # what serves it (test/e2e/test_gpt_oss.py)
        (GPT_OSS, [], True, False),  # CUDA: SGLang picks a backend with sinks
        (GPT_OSS, ["--attention-backend", "torch_native"], True, True),
        (GPT_OSS, ["--attention-backend", "triton", "--decode-attention-backend", "torch_native"], False, True),
        ({"architectures": ["InternVLChatModel"], "llm_config": {"architectures": ["GptOssForCausalLM"]}}, [], False,
         True),  # a VL wrapper around it
        ({"architectures": ["LagunaForCausalLM"]}, [], False, False),  # a sliding-window hybrid without sinks
    ],
)  # fmt: skip
def test_attention_sinks_are_refused_on_torch_native(config: dict, argv: list[str], cuda: bool, refused: bool) -> None:
    """gpt-oss passes ``sinks=`` to its attention, which torch_native does not take: refused by name before SGLang
    starts (it would fail at the first request), and at the scheduler from the resolved backend."""
    features = Features.from_argv(argv, {}, kv_owner_check=True, tenants_file=True, model_config=config,
                                  cuda_available=cuda)  # fmt: skip
    assert [r.feature for r in refusals(features)] == ([SINKS] if refused else [])
    if refused:
        assert "--attention-backend triton" in coverage.explain(refusals(features))
    server_args = SimpleNamespace(attention_backend="torch_native", prefill_attention_backend=None,
                                  decode_attention_backend=None, device="cpu")  # fmt: skip
    at_scheduler = Features.from_server_args(server_args, kv_owner_check=True, tenants_file=True, attention_sinks=True)
    assert [r.feature for r in refusals(at_scheduler)] == [SINKS]
    server_args.attention_backend = "triton"  # control: the backend with sinks passes
    assert refusals(Features.from_server_args(server_args, kv_owner_check=True, tenants_file=True,
                                              attention_sinks=True)) == []  # fmt: skip
