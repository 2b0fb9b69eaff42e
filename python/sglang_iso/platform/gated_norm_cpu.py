"""A torch version of the gated RMSNorm of linear-attention layers on CPU.

SGLang's ``FusedRMSNormGated`` (the norm after the GDN delta rule, ``sglang.kernels.ops.attention.fla
.fused_norm_gate``) calls its module's ``rms_norm_gated``, a Triton kernel with block pointers, which this
Triton's interpreter no longer has. :func:`apply` replaces that function on import, only where the CPU shims
apply: ``y = x * rsqrt(mean(x^2) + eps) * weight * act(gate)`` per row of the last dimension (``act`` SiLU for
``swish``/``silu``, else sigmoid; a residual is added first). Nothing on disk changes.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from sglang_iso.platform.import_patch import ShimOnImport

NORM_MODULE = "sglang.kernels.ops.attention.fla.fused_norm_gate"


def apply() -> bool:
    """Replace the gated RMSNorm's Triton path (now, or when its module is imported). Idempotent; False with
    CUDA."""
    return _NORM_SHIM.apply()


def patch_norm_module(module: types.ModuleType) -> None:
    """Point :data:`NORM_MODULE`'s ``rms_norm_gated`` at :func:`rms_norm_gated_cpu` (idempotent)."""
    module.rms_norm_gated = rms_norm_gated_cpu  # type: ignore[attr-defined]


def rms_norm_gated_cpu(
    x: torch.Tensor,
    g: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    activation: str = "swish",
    residual: torch.Tensor | None = None,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMS-normalize ``x`` over its last dimension, scale by ``weight`` (plus ``bias``), gate by ``act(g)``;
    with ``prenorm`` also return ``x + residual`` (float32 with ``residual_in_fp32``)."""
    summed = x.float() if residual is None else x.float() + residual.float()
    y = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    gate = g.float()
    y = y * (F.silu(gate) if activation in ("swish", "silu") else torch.sigmoid(gate))
    if not prenorm:
        return y.to(x.dtype)
    kept = residual.dtype if residual is not None else (torch.float32 if residual_in_fp32 else x.dtype)
    return y.to(x.dtype), summed.to(kept)


_NORM_SHIM = ShimOnImport([NORM_MODULE], patch_norm_module)
