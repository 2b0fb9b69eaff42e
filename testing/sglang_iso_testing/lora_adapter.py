"""A tiny seeded PEFT LoRA adapter for the bundled model, written by hand (no ``peft`` needed).

Rank 8 on ``q_proj`` and ``v_proj`` of every layer, in PEFT's on-disk format
(``adapter_config.json`` + ``adapter_model.safetensors``). The weights are
large enough that greedy outputs differ from the base model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from sglang_iso.models import tiny_model_path

RANK = 8
TARGETS = ("q_proj", "v_proj")


def write_tiny_adapter(directory: Path, *, seed: int, scale: float = 0.5) -> Path:
    """Write an adapter for the bundled tiny model into ``directory``; returns it."""
    config = json.loads((tiny_model_path() / "config.json").read_text())
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // int(config["num_attention_heads"]))
    out_dims = {
        "q_proj": int(config["num_attention_heads"]) * head_dim,
        "v_proj": int(config["num_key_value_heads"]) * head_dim,
    }
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for target in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, hidden, generator=gen) * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_dims[target], RANK, generator=gen) * scale
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(tiny_model_path()),
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return directory
