"""KV pool size the launcher picks on CPU when the user sets none.

Without ``--max-total-tokens`` SGLang sizes the CPU KV pool from free memory
(tens of millions of token slots on an ordinary machine), and every request then
pays for copying the allocator's free list. The launcher instead sizes the pool
for the work the server can hold: the model's context length times the running
requests, capped, and never below one full-length request::

    pool = clamp(context_len * running, context_len, CPU_POOL_MAX_TOKENS)

``running`` is ``--max-running-requests`` when given, else ``CPU_RUNNING_REQUESTS``
(then also passed to SGLang, so both limits agree).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_iso.server.argv import flag_value as _value
from sglang_iso.server.argv import has_flag as _has

CPU_RUNNING_REQUESTS = 32  # running requests assumed (and set) when --max-running-requests is not given
CPU_POOL_MAX_TOKENS = 1 << 20  # token slots; beyond this the free-list copies dominate a CPU request
FALLBACK_CONTEXT_LEN = 8192  # tokens, when the model's config cannot be read (e.g. a hub id)
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "model_max_length")
# Flags with which the user chose the pool size (or asked SGLang to derive it from memory) themselves.
_USER_SIZING_FLAGS = ("--max-total-tokens", "--mem-fraction-static")


def cpu_pool_flags(argv: Sequence[str]) -> list[str]:
    """SGLang flags that size the CPU KV pool, or ``[]`` when the user sized it.

    Raises:
        ValueError: ``--context-length`` or ``--max-running-requests`` is not a positive integer.
    """
    if any(_has(argv, flag) for flag in _USER_SIZING_FLAGS):
        return []
    extra: list[str] = []
    running_arg = _value(argv, "--max-running-requests")
    if running_arg is None:
        running = CPU_RUNNING_REQUESTS
        extra += ["--max-running-requests", str(running)]
    else:
        running = _positive("--max-running-requests", running_arg)
    context_arg = _value(argv, "--context-length")
    context = _positive("--context-length", context_arg) if context_arg else model_context_len(argv)
    pool = min(context * running, max(CPU_POOL_MAX_TOKENS, context))
    return ["--max-total-tokens", str(pool), *extra]


def local_model_config(argv: Sequence[str]) -> dict[str, Any]:
    """The model directory's ``config.json`` when ``--model-path`` is a local directory, else ``{}``."""
    model = _value(argv, "--model-path") or _value(argv, "--model")
    config_file = Path(model) / "config.json" if model else None
    try:
        config = json.loads(config_file.read_text()) if config_file is not None and config_file.is_file() else {}
    except (OSError, ValueError):
        config = {}
    return config if isinstance(config, dict) else {}


def model_context_len(argv: Sequence[str]) -> int:
    """The context length in the model directory's ``config.json`` (text config first), else the fallback."""
    config = local_model_config(argv)
    for section in (config.get("text_config"), config):
        if isinstance(section, dict):
            for key in _CONTEXT_KEYS:
                value = section.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return FALLBACK_CONTEXT_LEN


def _positive(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{flag} must be a positive integer, got {text!r}")
    return value
