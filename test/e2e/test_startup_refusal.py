"""The server refuses to start rather than serve with a tree cache that is not ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_iso import envvars
from sglang_iso.models import tiny_model_path
from sglang_iso_testing.process import ServerProcess, ServerStartError, baseline_server_argv, free_port

from .conftest import CPU_SIZES, start_iso_server

pytestmark = pytest.mark.e2e


def test_without_our_plugin_the_launcher_refuses_to_start() -> None:
    # SGLANG_PLUGINS is SGLang's allow-list: leaving sglang_iso out means the
    # tenant backend is never registered in the scheduler.
    server = start_iso_server(env={"SGLANG_PLUGINS": "smg-zmq"})
    with pytest.raises(ServerStartError) as err:
        server.start(timeout_s=240)
    server.keep_log = False  # an expected refusal: its log tail is in the error
    server.stop()
    assert "'tenant' is not registered" in str(err.value)


def test_scheduler_check_refuses_the_default_tree_cache() -> None:
    # Upstream's default tree cache with enforcement on: our scheduler hook must stop it.
    port = free_port()
    server = ServerProcess(
        baseline_server_argv(port, tiny_model_path(), *CPU_SIZES), port, env={envvars.REQUIRE_TENANT_CACHE.name: "1"}
    )
    with pytest.raises(ServerStartError) as err:
        server.start(timeout_s=240)
    server.keep_log = False  # an expected refusal: its log tail is in the error
    server.stop()
    assert "refusing to serve unhardened" in str(err.value)


def test_uncovered_draft_model_speculative_decoding_is_refused_by_name() -> None:
    # With the owner check off the launcher lets it through; the scheduler still refuses FROZEN_KV_MTP (its own worker
    # keeps draft KV the scrubber and the owner check do not cover) before any model loads. NGRAM, STANDALONE
    # and the EAGLE family are served: test_speculative.py, test_speculative_draft.py.
    model = str(tiny_model_path())
    server = start_iso_server(
        "--kv-owner-check", "off", "--attention-backend", "triton", "--speculative-algorithm", "FROZEN_KV_MTP",
        "--speculative-draft-model-path", model, "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3",
        env={"TRITON_INTERPRET": "1"},
    )  # fmt: skip
    with pytest.raises(ServerStartError) as err:
        server.start(timeout_s=240)
    server.keep_log = False  # an expected refusal: its log tail is in the error
    server.stop()
    assert "does not support --speculative-algorithm FROZEN_KV_MTP" in str(err.value)


def test_a_hybrid_linear_attention_model_with_an_uncovered_flag_is_refused_by_the_launcher_by_name(
    tmp_path: Path,
) -> None:
    """A Qwen3-Next-shaped model directory with the extra-buffer state strategy: the launcher reads ``config.json``
    and refuses the combination first, naming the flag (the model itself is served: test_linear_attn_cpu.py)."""
    config = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 2048,
              "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    server = start_iso_server("--mamba-radix-cache-strategy", "extra_buffer", model=tmp_path)
    with pytest.raises(ServerStartError) as err:
        server.start(timeout_s=120)
    server.keep_log = False  # an expected refusal: its log tail is in the error
    server.stop()
    assert "--mamba-radix-cache-strategy extra_buffer with hybrid SSM/Mamba models" in str(err.value)
