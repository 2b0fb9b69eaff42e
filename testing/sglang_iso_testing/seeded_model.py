"""What the tiny seeded models written at test time share: the bundled tokenizer, seeded draws, the directory."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from sglang_iso.models import tiny_model_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def unit_draws(gen: torch.Generator) -> Callable[..., torch.Tensor]:
    """``draw(*shape)``: seeded normal weights scaled by the input width, so each layer's outputs have unit variance
    (large enough that attention changes the output, unlike SGLang's ``--load-format dummy``)."""

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * (1.0 / shape[-1]) ** 0.5

    return draw


def write_model_dir(directory: Path, config: dict[str, Any], weights: dict[str, torch.Tensor] | None) -> Path:
    """Write ``config.json``, the bundled tokenizer and ``model.safetensors`` to ``directory``; returns it.
    ``weights`` None writes no weights (a model served with ``--load-format dummy``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_model_path() / name, directory / name)
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if weights is None:
        return directory
    tensors = {k: v.contiguous() for k, v in weights.items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
