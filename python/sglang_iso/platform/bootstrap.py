"""Process start-up for sglang-iso entry points (before any SGLang import)."""

from __future__ import annotations

from sglang_iso import envvars
from sglang_iso.platform import cpu, gated_norm_cpu, hicache_cpu, lora_cpu, mamba2_cpu, mla_cpu, moe_gate_cpu, pd_cpu


def apply() -> None:
    """Apply the platform shims this process needs. Idempotent."""
    cpu.apply()
    lora_cpu.apply()
    hicache_cpu.apply()
    pd_cpu.apply()
    mla_cpu.apply()
    gated_norm_cpu.apply()
    mamba2_cpu.apply()
    moe_gate_cpu.apply()


def cuda_available() -> bool:
    if envvars.FORCE_CPU.get() == "1":  # NOTE: read before the launcher sets its variables
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
