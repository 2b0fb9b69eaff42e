"""A tiny DeepSeek-V3-shaped model (MLA, optionally MoE and an MTP layer), written at test time.

The config is DeepSeek-V3's own layout scaled down: MLA with a 256-wide latent and
32-wide rope part (a 288-wide cache row, one of the two widths SGLang's Triton MLA
decode kernel is built for; DeepSeek-V3's is 576), YaRN rope scaling, sigmoid ``noaux_tc`` routing over grouped
experts with a shared expert, and ``num_nextn_predict_layers`` for MTP. It has
no ``index_topk``, so SGLang does not treat it as a DSA model (``dsa=True`` adds
one, for the refusal test). The tokenizer is the bundled tiny model's.

Weights are seeded normal draws in DeepSeek-V3's checkpoint names, the MTP layer
(``model.layers.<num_hidden_layers>.*``: ``enorm``, ``hnorm``, ``eh_proj``,
``shared_head``, and an MoE decoder layer) included. Their scale is large enough
that attention changes the output (SGLang's ``--load-format dummy`` draws in
+-1e-3, where the output hardly depends on the context, which would let a test
comparing outputs pass whatever the attention read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sglang_iso_testing.seeded_model import unit_draws, write_model_dir

DTYPE_FLAGS = ("--dtype", "float32")
"""SGLang serves a float32 checkpoint in float16 by default. A fresh prefill runs MLA decompressed and a cached
prefix absorbed (with Triton): in float16 the two differ by more than this model's top-two logit gaps, so outputs of
a hit and a miss could part at a tie; float32 keeps that to real ties."""
MTP_FLAGS = (
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3",
)  # fmt: skip
"""NEXTN (MTP) with the model's own draft layer (SGLang reads it from the target's directory)."""


def deepseek_config(*, experts: bool = True, dsa: bool = False) -> dict[str, Any]:
    """The config: two layers, the first dense, the second MoE when ``experts`` (else dense too)."""
    config: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 2048,
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 256,
        "q_lora_rank": None,
        "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "topk_method": "noaux_tc",
        "n_group": 2,
        "topk_group": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1 if experts else 2,
        "moe_layer_freq": 1,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 2048,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "dtype": "float32",
        "num_nextn_predict_layers": 1,
    }
    if dsa:
        config.update(index_topk=64, index_head_dim=128, index_n_heads=4)
    return config


def write_tiny_deepseek(directory: Path, *, experts: bool = True, dsa: bool = False, seed: int = 0) -> Path:
    """Write the model directory (config, tokenizer, seeded weights) to ``directory``; returns it."""
    config = deepseek_config(experts=experts, dsa=dsa)
    return write_model_dir(directory, config, _weights(config, seed))


def _weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden, vocab, heads = config["hidden_size"], config["vocab_size"], config["num_attention_heads"]
    latent, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    nope, v_dim = config["qk_nope_head_dim"], config["v_head_dim"]

    draw = unit_draws(gen)

    def norm() -> torch.Tensor:
        return torch.ones(hidden)

    def mlp(prefix: str, width: int) -> dict[str, torch.Tensor]:
        return {
            f"{prefix}.gate_proj.weight": draw(width, hidden),
            f"{prefix}.up_proj.weight": draw(width, hidden),
            f"{prefix}.down_proj.weight": draw(hidden, width),
        }

    def layer(i: int, *, moe: bool) -> dict[str, torch.Tensor]:
        p = f"model.layers.{i}"
        out = {
            f"{p}.input_layernorm.weight": norm(),
            f"{p}.post_attention_layernorm.weight": norm(),
            f"{p}.self_attn.q_proj.weight": draw(heads * (nope + rope), hidden),
            f"{p}.self_attn.kv_a_proj_with_mqa.weight": draw(latent + rope, hidden),
            f"{p}.self_attn.kv_a_layernorm.weight": torch.ones(latent),
            f"{p}.self_attn.kv_b_proj.weight": draw(heads * (nope + v_dim), latent),
            f"{p}.self_attn.o_proj.weight": draw(hidden, heads * v_dim),
        }
        if not moe:
            return {**out, **mlp(f"{p}.mlp", config["intermediate_size"])}
        width = config["moe_intermediate_size"]
        out[f"{p}.mlp.gate.weight"] = draw(config["n_routed_experts"], hidden)
        out[f"{p}.mlp.gate.e_score_correction_bias"] = torch.zeros(config["n_routed_experts"])
        out.update(mlp(f"{p}.mlp.shared_experts", width * config["n_shared_experts"]))
        for e in range(config["n_routed_experts"]):
            out.update(mlp(f"{p}.mlp.experts.{e}", width))
        return out

    layers = config["num_hidden_layers"]
    weights: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
        "model.norm.weight": norm(),
        "lm_head.weight": draw(vocab, hidden),
    }
    for i in range(layers):
        weights.update(layer(i, moe=i >= config["first_k_dense_replace"]))
    mtp = f"model.layers.{layers}"
    weights.update(layer(layers, moe=True))  # NOTE: SGLang's MTP layer is always MoE (``is_nextn``)
    weights.update({
        f"{mtp}.enorm.weight": norm(),
        f"{mtp}.hnorm.weight": norm(),
        f"{mtp}.eh_proj.weight": draw(hidden, 2 * hidden),
        f"{mtp}.shared_head.norm.weight": norm(),
        f"{mtp}.shared_head.head.weight": weights["lm_head.weight"].clone(),
        f"{mtp}.embed_tokens.weight": weights["model.embed_tokens.weight"].clone(),
    })  # fmt: skip
    return weights
