"""Torch stand-ins for the convolution and gating ops of linear-attention (GDN) layers on CPU.

SGLang's CPU path (``SGLANG_USE_CPU_ENGINE=1``, set by :mod:`sglang_iso.platform.cpu`) takes the GDN layers'
short convolution from ``sgl_kernel.mamba`` (``causal_conv1d_fn_cpu`` for prefill, ``causal_conv1d_update_cpu``
for decode) and their gates from ``torch.ops.sgl_kernel.fused_gdn_gating_cpu``; no CPU build of ``sgl_kernel``
is published. These are torch versions of the same contracts (argument lists of SGLang's CPU call sites in
``layers/attention/linear/gdn_backend.py``; semantics of SGLang's own Triton kernels in
``sglang.kernels.ops.mamba.causal_conv1d_triton`` and ``...attention.linear.fused_gdn_gating``, which the kernel
tests compare against in Triton's interpreter).

Per sequence ``i`` of a prefill batch (tokens ``query_start_loc[i] .. query_start_loc[i + 1]`` of ``x``, conv
state line ``cache_indices[i]``, ``W = width``)::

    window = [state[:, :W-1] if has_initial_state[i] else zeros, x_i]      (dim, W-1 + len_i)
    out_i[:, t] = act(bias + sum_w weight[:, w] * window[:, t + w])
    state[:, :W-1] = window[:, -(W-1):]                                     (zeros first when len_i < W-1)

Decode (``causal_conv1d_update_cpu``) is the same with the state always taken, one or more tokens per request.
Lines equal to the pad slot id (-1) are skipped (their output is left as allocated).

Not here yet: the delta-rule recurrences (``sgl_kernel.mamba.chunk_gated_delta_rule_cpu`` raises
:class:`~sglang_iso.platform.cpu.MissingKernelError` naming itself when called;
``torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu`` is not registered, so SGLang's GDN kernel
module fails at import, which SGLang's model registry logs and skips) and the speculative target-verify form of
the decode convolution. Hybrid linear-attention models stay refused at start
(:mod:`sglang_iso.coverage`) until the tenant tree keeps their recurrent state; these make the layers computable
on CPU first.
"""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

import torch
import torch.nn.functional as F

MAMBA_MODULE = "sgl_kernel.mamba"
PAD_SLOT_ID = -1
_MISSING = ("chunk_gated_delta_rule_cpu",)
"""``sgl_kernel.mamba`` functions SGLang imports that have no stand-in yet."""

_library: torch.library.Library | None = None


def install(stub: types.ModuleType) -> None:
    """Add ``sgl_kernel.mamba`` to the stand-in module ``stub`` and register the ``torch.ops.sgl_kernel``
    ops (idempotent)."""
    from sglang_iso.platform.cpu import missing_kernel

    mamba = sys.modules.get(MAMBA_MODULE)
    if mamba is None:
        mamba = types.ModuleType(MAMBA_MODULE)
        mamba.__doc__ = "sglang-iso stand-in: torch versions of the linear-attention convolution ops."
        sys.modules[MAMBA_MODULE] = mamba
    mamba.causal_conv1d_fn_cpu = causal_conv1d_fn_cpu  # type: ignore[attr-defined]
    mamba.causal_conv1d_update_cpu = causal_conv1d_update_cpu  # type: ignore[attr-defined]
    for name in _MISSING:
        setattr(mamba, name, missing_kernel(f"{MAMBA_MODULE}.{name}"))
    stub.mamba = mamba  # type: ignore[attr-defined]
    _register_ops()


def _register_ops() -> None:
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    lib.define("fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)")
    lib.impl("fused_gdn_gating_cpu", fused_gdn_gating_cpu, "CPU")
    _library = lib


def fused_gdn_gating_cpu(
    A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN gates of ``[tokens, heads]`` inputs: ``g = -exp(A_log) * softplus(a + dt_bias)`` and
    ``beta = sigmoid(b)``, each ``[1, tokens, heads]`` float32 (softplus with beta 1, linear above 20)."""
    x = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * F.softplus(x, beta=1.0, threshold=20.0)
    return g.unsqueeze(0), torch.sigmoid(b.float()).unsqueeze(0)


def causal_conv1d_fn_cpu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | bool | None = "silu",
    conv_states: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    cache_indices: torch.Tensor | None = None,
    query_start_loc: torch.Tensor | None = None,
    seq_lens_cpu: Any = None,
    **_kwargs: Any,
) -> torch.Tensor:
    """Prefill convolution of a packed batch (see the module doc).

    Args:
        x: ``(dim, total_tokens)``, the batch's sequences one after another.
        weight: ``(dim, width)``.
        bias: ``(dim,)`` or None.
        activation: ``"silu"``/``"swish"``/True, or None/False for none.
        conv_states: ``(lines, dim, >= width - 1)``. MUTATED: each processed sequence's line.
        has_initial_state: ``(batch,)`` bool; None: no sequence starts from its line.
        cache_indices: ``(batch,)`` line per sequence; None: sequence ``i`` uses line ``i``.
        query_start_loc: ``(batch + 1,)`` token offsets.
        seq_lens_cpu: unused (the offsets say the same).

    Returns:
        ``(dim, total_tokens)`` in ``x``'s dtype.

    Raises:
        ValueError: ``query_start_loc`` or ``conv_states`` is missing.
    """
    del seq_lens_cpu
    if query_start_loc is None or conv_states is None:
        raise ValueError("causal_conv1d_fn_cpu needs query_start_loc and conv_states")
    width = int(weight.shape[1])
    keep = width - 1
    starts = [int(v) for v in query_start_loc.tolist()]
    lines = cache_indices.tolist() if cache_indices is not None else list(range(len(starts) - 1))
    initial = has_initial_state.tolist() if has_initial_state is not None else [False] * (len(starts) - 1)
    out = torch.empty_like(x)
    for i, (begin, end) in enumerate(itertools.pairwise(starts)):
        line = int(lines[i])
        if line == PAD_SLOT_ID:
            continue
        seq = x[:, begin:end]
        prior = conv_states[line, :, :keep].to(x.dtype) if initial[i] else x.new_zeros(x.shape[0], keep)
        window = torch.cat([prior, seq], dim=1)  # (dim, keep + len)
        out[:, begin:end] = _convolve(window, weight, bias, activation).to(x.dtype)
        if keep:
            conv_states[line, :, :keep] = window[:, -keep:].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(
    x: torch.Tensor,
    conv_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | bool | None = None,
    conv_state_indices: torch.Tensor | None = None,
    intermediate_conv_window: torch.Tensor | None = None,
    **_kwargs: Any,
) -> torch.Tensor:
    """Decode convolution: each request's line is the window's start, one or more new tokens.

    Args:
        x: ``(batch, dim)`` or ``(batch, dim, tokens)``.
        conv_states: ``(lines, dim, >= width - 1)``. MUTATED: each processed request's line.
        weight, bias, activation: as :func:`causal_conv1d_fn_cpu`.
        conv_state_indices: ``(batch,)`` line per request; None: request ``i`` uses line ``i``.
        intermediate_conv_window: must be None (speculative target verify has no stand-in).

    Returns:
        The same shape as ``x``.

    Raises:
        MissingKernelError: a target-verify call (``intermediate_conv_window`` given).
    """
    if intermediate_conv_window is not None:
        from sglang_iso.platform.cpu import missing_kernel

        missing_kernel(f"{MAMBA_MODULE}.causal_conv1d_update_cpu (speculative target verify)")()
    single = x.dim() == 2
    xs = x.unsqueeze(-1) if single else x  # (batch, dim, tokens)
    keep = int(weight.shape[1]) - 1
    lines = conv_state_indices.tolist() if conv_state_indices is not None else list(range(xs.shape[0]))
    out = torch.empty_like(xs)
    for i, line in enumerate(int(v) for v in lines):
        if line == PAD_SLOT_ID:
            continue
        window = torch.cat([conv_states[line, :, :keep].to(xs.dtype), xs[i]], dim=1)  # (dim, keep + tokens)
        out[i] = _convolve(window, weight, bias, activation).to(xs.dtype)
        if keep:
            conv_states[line, :, :keep] = window[:, -keep:].to(conv_states.dtype)
    return out.squeeze(-1) if single else out


def _convolve(
    window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | bool | None
) -> torch.Tensor:
    """``(dim, width - 1 + n)`` window -> ``(dim, n)``: each output the dot of its last ``width`` inputs, in
    float32."""
    width = int(weight.shape[1])
    taps = window.float().unfold(1, width, 1)  # (dim, n, width)
    y = (taps * weight.float()[:, None, :]).sum(-1)
    if bias is not None:
        y = y + bias.float()[:, None]
    if activation in ("silu", "swish", True):
        y = F.silu(y)
    return y
