"""A tiny gpt-oss-shaped model (sliding and full attention in turn, attention sinks, MoE), written at test time.

``GptOssForCausalLM`` is a hybrid SWA model: SGLang keeps its sliding layers' KV in a sub-pool of its own unless
``--disable-hybrid-swa-memory`` (the launcher's default) puts every layer's KV in one pool. Its attention passes
per-head sink logits, which only the Triton backend takes on CPU (torch_native has no ``sinks`` argument), so it is
served with ``--attention-backend triton`` under ``TRITON_INTERPRET=1``. Four layers (sliding, full, sliding, full),
four experts with two per token, biases on attention and experts as in the released checkpoints, a window of
:data:`WINDOW` tokens. Weights are seeded normal draws in the Hugging Face checkpoint names SGLang's loader reads
(unquantized: ``experts.gate_up_proj`` ``[E, hidden, 2 * width]``, gate and up interleaved).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sglang_iso_testing.seeded_model import unit_draws, write_model_dir

WINDOW = 8
"""The config's ``sliding_window`` (Hugging Face's inclusive count; SGLang attends to ``WINDOW - 1`` earlier tokens)."""
SERVE_FLAGS = ("--dtype", "float32", "--attention-backend", "triton")
"""float32 (a cached and a recomputed prefix give the same logits up to real ties); Triton for the sinks."""


def gpt_oss_config() -> dict[str, Any]:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "vocab_size": 2048,
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "experts_per_token": 2,
        "hidden_act": "silu",
        "swiglu_limit": 7.0,
        "attention_bias": True,
        "rope_theta": 150000.0,
        "max_position_embeddings": 4096,
        "initial_context_length": 4096,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
    }


def write_tiny_gpt_oss(directory: Path, *, seed: int = 0) -> Path:
    """Write the model directory (config, tokenizer, seeded weights) to ``directory``; returns it."""
    config = gpt_oss_config()
    return write_model_dir(directory, config, _weights(config, seed))


def _weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden, vocab, head_dim = config["hidden_size"], config["vocab_size"], config["head_dim"]
    heads, kv_heads, width = config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]
    experts = config["num_local_experts"]

    draw = unit_draws(gen)

    def small(*shape: int) -> torch.Tensor:
        return 0.1 * torch.randn(*shape, generator=gen)

    weights: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": draw(vocab, hidden),
    }
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        weights.update({
            f"{p}.input_layernorm.weight": torch.ones(hidden),
            f"{p}.post_attention_layernorm.weight": torch.ones(hidden),
            f"{p}.self_attn.q_proj.weight": draw(heads * head_dim, hidden),
            f"{p}.self_attn.q_proj.bias": small(heads * head_dim),
            f"{p}.self_attn.k_proj.weight": draw(kv_heads * head_dim, hidden),
            f"{p}.self_attn.k_proj.bias": small(kv_heads * head_dim),
            f"{p}.self_attn.v_proj.weight": draw(kv_heads * head_dim, hidden),
            f"{p}.self_attn.v_proj.bias": small(kv_heads * head_dim),
            f"{p}.self_attn.o_proj.weight": draw(hidden, heads * head_dim),
            f"{p}.self_attn.o_proj.bias": small(hidden),
            f"{p}.self_attn.sinks": small(heads),
            f"{p}.mlp.router.weight": draw(experts, hidden),
            f"{p}.mlp.router.bias": small(experts),
            f"{p}.mlp.experts.gate_up_proj": draw(experts, 2 * width, hidden).transpose(1, 2),
            f"{p}.mlp.experts.gate_up_proj_bias": small(experts, 2 * width),
            f"{p}.mlp.experts.down_proj": draw(experts, hidden, width).transpose(1, 2),
            f"{p}.mlp.experts.down_proj_bias": small(experts, hidden),
        })  # fmt: skip
    return weights
