"""A tiny Qwen3-Next-shaped hybrid linear-attention model (GDN and full attention layers in turn, MoE), written at
test time with seeded weights (checkpoint names as Qwen3-Next's, one tensor per expert), scaled so that every
layer changes the output: a reply depends on the whole context, the recurrent state included, so a request that
ran on the wrong state answers differently (SGLang's ``--load-format dummy`` gives a model that echoes its last token).

Two GDN layers and two full-attention layers (``full_attention_interval`` 2), 4 experts with 2 per token and a
shared expert; the tokenizer is the bundled tiny model's. SGLang keeps each request's recurrent state in a
``MambaPool``; on CPU its state cache needs ``--mamba-radix-cache-strategy no_buffer`` and
``--disable-overlap-schedule`` (:data:`SERVE_FLAGS`, with a state pool of 128 slots: sized from memory on
CPU, SGLang's default holds gigabytes). The MoE shared-expert gate, a Triton kernel in SGLang, runs on the torch
stand-in of ``platform/moe_gate_cpu.py``: no Triton interpreter is needed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from sglang_iso_testing.seeded_model import unit_draws, write_model_dir

SERVE_FLAGS = (
    "--dtype", "float32", "--mamba-radix-cache-strategy", "no_buffer",
    "--disable-overlap-schedule", "--max-mamba-cache-size", "128",
)  # fmt: skip


def qwen3_next_config() -> dict[str, Any]:
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": 2048,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "full_attention_interval": 2,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "max_position_embeddings": 2048,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
    }


def write_tiny_qwen3_next(directory: Path, *, seed: int = 0) -> Path:
    """Write the model directory (config, the bundled tokenizer, seeded weights) to ``directory``; returns it."""
    config = qwen3_next_config()
    return write_model_dir(directory, config, _weights(config, seed))


def _weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights under Qwen3-Next's checkpoint names. Its RMS norms are zero-centred (``x * (1 + w)``): zeros
    are the identity there; the GDN output norm is a plain one (ones)."""
    gen = torch.Generator().manual_seed(seed)
    draw = unit_draws(gen)
    hidden, vocab, head_dim = config["hidden_size"], config["vocab_size"], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    k_dim, v_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
    key, value, kernel = k_heads * k_dim, v_heads * v_dim, config["linear_conv_kernel_dim"]
    experts, expert_width = config["num_experts"], config["moe_intermediate_size"]
    shared_width = config["shared_expert_intermediate_size"]
    weights: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
        "model.norm.weight": torch.zeros(hidden),
        "lm_head.weight": draw(vocab, hidden),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        if (i + 1) % config["full_attention_interval"] == 0:
            weights.update({
                f"{p}.self_attn.q_proj.weight": draw(2 * heads * head_dim, hidden),  # queries and their output gate
                f"{p}.self_attn.k_proj.weight": draw(kv_heads * head_dim, hidden),
                f"{p}.self_attn.v_proj.weight": draw(kv_heads * head_dim, hidden),
                f"{p}.self_attn.o_proj.weight": draw(hidden, heads * head_dim),
                f"{p}.self_attn.q_norm.weight": torch.zeros(head_dim),
                f"{p}.self_attn.k_norm.weight": torch.zeros(head_dim),
            })  # fmt: skip
        else:
            weights.update({
                f"{p}.linear_attn.in_proj_qkvz.weight": draw(2 * key + 2 * value, hidden),
                f"{p}.linear_attn.in_proj_ba.weight": draw(2 * v_heads, hidden),
                f"{p}.linear_attn.conv1d.weight": draw(2 * key + value, 1, kernel),
                f"{p}.linear_attn.dt_bias": torch.ones(v_heads),
                # NOTE: decay rates exp(-exp(A_log) * dt) well below 1: the state forgets, but not within a token
                f"{p}.linear_attn.A_log": torch.log(torch.empty(v_heads).uniform_(1.0, 4.0, generator=gen) / math.e),
                f"{p}.linear_attn.norm.weight": torch.ones(v_dim),
                f"{p}.linear_attn.out_proj.weight": draw(hidden, value),
            })  # fmt: skip
        weights.update({
            f"{p}.input_layernorm.weight": torch.zeros(hidden),
            f"{p}.post_attention_layernorm.weight": torch.zeros(hidden),
            f"{p}.mlp.gate.weight": draw(experts, hidden),
            f"{p}.mlp.shared_expert.gate_proj.weight": draw(shared_width, hidden),
            f"{p}.mlp.shared_expert.up_proj.weight": draw(shared_width, hidden),
            f"{p}.mlp.shared_expert.down_proj.weight": draw(hidden, shared_width),
            f"{p}.mlp.shared_expert_gate.weight": draw(1, hidden),
        })  # fmt: skip
        for e in range(experts):
            weights.update({
                f"{p}.mlp.experts.{e}.gate_proj.weight": draw(expert_width, hidden),
                f"{p}.mlp.experts.{e}.up_proj.weight": draw(expert_width, hidden),
                f"{p}.mlp.experts.{e}.down_proj.weight": draw(hidden, expert_width),
            })  # fmt: skip
    return weights
