"""A tiny Qwen3-Next-shaped hybrid linear-attention model (GDN and full attention layers in turn, MoE), written at
test time without weights: served with ``--load-format dummy``, which is enough to run every layer's CPU path.

Two GDN layers and two full-attention layers (``full_attention_interval`` 2), 4 experts with 2 per token and a
shared expert; the tokenizer is the bundled tiny model's. SGLang keeps each request's recurrent state in a
``MambaPool``; on CPU its state cache needs ``--mamba-radix-cache-strategy no_buffer`` and
``--disable-overlap-schedule`` (:data:`SERVE_FLAGS`, with a state pool of 128 slots: sized from memory on
CPU, SGLang's default holds gigabytes), and the MoE shared-expert gate is a Triton kernel, so the
server runs with ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sglang_iso_testing.seeded_model import write_model_dir

SERVE_FLAGS = (
    "--load-format", "dummy", "--dtype", "float32", "--mamba-radix-cache-strategy", "no_buffer",
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


def write_tiny_qwen3_next(directory: Path) -> Path:
    """Write ``config.json`` and the bundled tokenizer (no weights) to ``directory``; returns it."""
    return write_model_dir(directory, qwen3_next_config(), None)
