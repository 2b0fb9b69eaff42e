"""A tiny Nemotron-H-shaped hybrid model (Mamba2, MLP and full-attention layers: pattern ``M-*-M-``), written at test
time with seeded weights under Nemotron-H's checkpoint names (``backbone.*``), scaled so that every layer changes the
output: a reply depends on the whole context, the Mamba2 states (convolution window and SSM state) included.

Mamba2 layers of 8 heads of 16 in 2 groups with a 16-wide state and a convolution of width 4; the tokenizer is the
bundled tiny model's. SGLang keeps each request's states in a ``MambaPool`` (as for Qwen3-Next), so the server
needs the same flags (:data:`SERVE_FLAGS`); on CPU the mixer runs the stand-ins of
:mod:`sglang_iso.platform.mamba2_cpu`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sglang_iso_testing.seeded_model import unit_draws, write_model_dir
from sglang_iso_testing.tiny_qwen3_next import SERVE_FLAGS

__all__ = ["SERVE_FLAGS", "nemotron_h_config", "write_tiny_nemotron_h"]


def nemotron_h_config() -> dict[str, Any]:
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "vocab_size": 2048,
        "hidden_size": 64,
        "intermediate_size": 128,
        "hybrid_override_pattern": "M-*-M-",
        "num_attention_heads": 4,
        "head_dim": 16,
        "num_key_value_heads": 2,
        "mlp_hidden_act": "relu2",
        "attention_bias": False,
        "mlp_bias": False,
        "use_bias": False,
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": False,
        "ssm_state_size": 16,
        "mamba_num_heads": 8,
        "mamba_n_groups": 2,
        "n_groups": 2,  # NOTE: the name SGLang's state shape reads (published configs carry both)
        "mamba_head_dim": 16,
        "mamba_d_conv": 4,
        "conv_kernel": 4,
        "mamba_expand": 2,
        "expand": 2,
        "mamba_hidden_act": "silu",
        "mamba_conv_bias": True,
        "use_conv_bias": True,
        "mamba_proj_bias": False,
        "mamba_chunk_size": 64,
        "chunk_size": 64,
        "max_position_embeddings": 2048,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
    }


def write_tiny_nemotron_h(directory: Path, *, seed: int = 0) -> Path:
    """Write the model directory (config, the bundled tokenizer, seeded weights) to ``directory``; returns it."""
    config = nemotron_h_config()
    return write_model_dir(directory, config, _weights(config, seed))


def _weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights under Nemotron-H's checkpoint names. Norms are plain RMS norms (ones); each Mamba2 head decays
    at its own rate (``A = -exp(A_log)``) with step sizes around 0.1 (``softplus(dt_bias)``), so the state keeps
    the context of many tokens."""
    gen = torch.Generator().manual_seed(seed)
    draw = unit_draws(gen)
    hidden, vocab, head_dim = config["hidden_size"], config["vocab_size"], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    m_heads, m_dim, groups = config["mamba_num_heads"], config["mamba_head_dim"], config["n_groups"]
    inner, state, kernel = m_heads * m_dim, config["ssm_state_size"], config["conv_kernel"]
    conv = inner + 2 * groups * state
    weights: dict[str, torch.Tensor] = {
        "backbone.embeddings.weight": torch.randn(vocab, hidden, generator=gen),
        "backbone.norm_f.weight": torch.ones(hidden),
        "lm_head.weight": draw(vocab, hidden),
    }
    for i, kind in enumerate(config["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}"
        weights[f"{p}.norm.weight"] = torch.ones(hidden)
        if kind == "M":
            weights.update({
                f"{p}.mixer.in_proj.weight": draw(inner + conv + m_heads, hidden),  # gate, conv input, step sizes
                f"{p}.mixer.conv1d.weight": draw(conv, 1, kernel),
                f"{p}.mixer.conv1d.bias": torch.zeros(conv),
                f"{p}.mixer.dt_bias": _inverse_softplus(torch.empty(m_heads).uniform_(0.05, 0.2, generator=gen)),
                f"{p}.mixer.A_log": torch.log(torch.empty(m_heads).uniform_(0.5, 4.0, generator=gen)),
                f"{p}.mixer.D": torch.ones(m_heads),
                f"{p}.mixer.norm.weight": torch.ones(inner),
                f"{p}.mixer.out_proj.weight": draw(hidden, inner),
            })  # fmt: skip
        elif kind == "*":
            weights.update({
                f"{p}.mixer.q_proj.weight": draw(heads * head_dim, hidden),
                f"{p}.mixer.k_proj.weight": draw(kv_heads * head_dim, hidden),
                f"{p}.mixer.v_proj.weight": draw(kv_heads * head_dim, hidden),
                f"{p}.mixer.o_proj.weight": draw(hidden, heads * head_dim),
            })  # fmt: skip
        else:
            width = config["intermediate_size"]
            weights.update({
                f"{p}.mixer.up_proj.weight": draw(width, hidden),
                f"{p}.mixer.down_proj.weight": draw(hidden, width),
            })  # fmt: skip
    return weights


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """``x`` with ``softplus(x) == y``."""
    x = y + torch.log(-torch.expm1(-y))
    torch.testing.assert_close(F.softplus(x), y)
    return x
