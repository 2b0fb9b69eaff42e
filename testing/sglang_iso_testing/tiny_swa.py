"""A tiny sliding-window hybrid model (Laguna-shaped: sliding and full attention layers in turn), written at test time.

SGLang runs ``LagunaForCausalLM`` as a hybrid SWA model: with its default memory layout the sliding layers' KV sits
in a sub-pool of its own (``SWAKVPool``), which sglang-iso refuses; with ``--disable-hybrid-swa-memory`` (the
launcher's default) every layer's KV is in one ``MHATokenToKVPool`` and the sliding window is an attention mask.
Four dense layers (sliding, full, sliding, full), no attention-output gating, a window of :data:`WINDOW` tokens, so
prompts of a few dozen tokens reach past it. The tokenizer is the bundled tiny model's; weights are seeded normal
draws in the checkpoint names SGLang's loader reads, at a scale where attention changes the output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sglang_iso_testing.seeded_model import unit_draws, write_model_dir

WINDOW = 8
"""The config's ``sliding_window`` (Hugging Face's inclusive count; SGLang attends to ``WINDOW - 1`` earlier tokens)."""
DTYPE_FLAGS = ("--dtype", "float32")
"""Served in float32, so a cached prefix and a recomputed one give the same logits up to real ties."""


def laguna_config() -> dict[str, Any]:
    return {
        "architectures": ["LagunaForCausalLM"],
        "model_type": "laguna",
        "vocab_size": 2048,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "mlp_layer_types": ["dense"] * 4,
        "num_experts": 4,
        "gating": False,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
    }


def write_tiny_swa(directory: Path, *, seed: int = 0) -> Path:
    """Write the model directory (config, tokenizer, seeded weights) to ``directory``; returns it."""
    config = laguna_config()
    return write_model_dir(directory, config, _weights(config, seed))


def _weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden, vocab, head_dim = config["hidden_size"], config["vocab_size"], config["head_dim"]
    heads, kv_heads, width = config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]

    draw = unit_draws(gen)

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
            f"{p}.self_attn.k_proj.weight": draw(kv_heads * head_dim, hidden),
            f"{p}.self_attn.v_proj.weight": draw(kv_heads * head_dim, hidden),
            f"{p}.self_attn.o_proj.weight": draw(hidden, heads * head_dim),
            f"{p}.self_attn.q_norm.weight": torch.ones(head_dim),
            f"{p}.self_attn.k_norm.weight": torch.ones(head_dim),
            f"{p}.mlp.gate_proj.weight": draw(width, hidden),
            f"{p}.mlp.up_proj.weight": draw(width, hidden),
            f"{p}.mlp.down_proj.weight": draw(hidden, width),
        })  # fmt: skip
    return weights
