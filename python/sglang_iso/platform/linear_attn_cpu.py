"""Torch stand-ins for the ops of linear-attention (GDN) layers on CPU.

SGLang's CPU path (``SGLANG_USE_CPU_ENGINE=1``, set by :mod:`sglang_iso.platform.cpu`) takes the GDN layers'
short convolution from ``sgl_kernel.mamba`` (``causal_conv1d_fn_cpu`` for prefill, ``causal_conv1d_update_cpu``
for decode), their gates from ``torch.ops.sgl_kernel.fused_gdn_gating_cpu`` and the gated delta rule from
``sgl_kernel.mamba.chunk_gated_delta_rule_cpu`` (prefill) and
``torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu`` (decode, gates fused); no CPU build of
``sgl_kernel`` is published. These are torch versions of the same contracts (argument lists of SGLang's CPU call
sites in ``layers/attention/linear/gdn_backend.py`` and ``.../kernels/gdn_triton.py``; semantics of SGLang's own
Triton kernels, which the kernel tests compare against in Triton's interpreter where those run).

Per sequence ``i`` of a prefill batch (tokens ``query_start_loc[i] .. query_start_loc[i + 1]`` of ``x``, conv
state line ``cache_indices[i]``, ``W = width``)::

    window = [state[:, :W-1] if has_initial_state[i] else zeros, x_i]      (dim, W-1 + len_i)
    out_i[:, t] = act(bias + sum_w weight[:, w] * window[:, t + w])
    state[:, :W-1] = window[:, -(W-1):]                                     (zeros first when len_i < W-1)

Decode (``causal_conv1d_update_cpu``) is the same with the state always taken, one or more tokens per request.
Lines equal to the pad slot id (-1) are skipped (their output is left as allocated).

The gated delta rule, per sequence and value head ``h`` (query/key head ``h // (HV // H)``), state ``S``
``(V, K)`` from the sequence's state slot (zeros for a negative slot), per token::

    q, k = l2norm(q), l2norm(k)          (with use_qk_l2norm_in_kernel; x / sqrt(sum(x^2) + 1e-6))
    S = S * exp(g);  u = beta * (v - S k);  S = S + u k^T;  o = S (q * K^-0.5)

and the final ``S`` is written back to the slot. The prefill op does it token by token (the chunked form is the
same recurrence regrouped). The gated RMSNorm after the delta rule (``FusedRMSNormGated``, Triton with block
pointers, which this Triton's interpreter no longer has) gets a torch version from
:mod:`sglang_iso.platform.gated_norm_cpu`.
Not here: the speculative target-verify forms of the decode ops (the convolution's
names itself; the delta rule's extra arguments fail the op's schema). Hybrid linear-attention models stay refused
at start (:mod:`sglang_iso.coverage`) until the tenant tree keeps their recurrent state; these make the layers
computable on CPU first.
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

_library: torch.library.Library | None = None


def install(stub: types.ModuleType) -> None:
    """Add ``sgl_kernel.mamba`` to the stand-in module ``stub`` and register the ``torch.ops.sgl_kernel``
    ops (idempotent)."""
    mamba = sys.modules.get(MAMBA_MODULE)
    if mamba is None:
        mamba = types.ModuleType(MAMBA_MODULE)
        mamba.__doc__ = "sglang-iso stand-in: torch versions of the linear-attention convolution ops."
        sys.modules[MAMBA_MODULE] = mamba
    mamba.causal_conv1d_fn_cpu = causal_conv1d_fn_cpu  # type: ignore[attr-defined]
    mamba.causal_conv1d_update_cpu = causal_conv1d_update_cpu  # type: ignore[attr-defined]
    mamba.chunk_gated_delta_rule_cpu = chunk_gated_delta_rule_cpu  # type: ignore[attr-defined]
    stub.mamba = mamba  # type: ignore[attr-defined]
    _register_ops()


def _register_ops() -> None:
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    lib.define("fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)")
    lib.impl("fused_gdn_gating_cpu", fused_gdn_gating_cpu, "CPU")
    lib.define(
        "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, "
        "Tensor a, Tensor b, Tensor(a!) initial_state_source, Tensor initial_state_indices, Tensor cu_seqlens, "
        "bool use_qk_l2norm_in_kernel, float softplus_beta=1.0, float softplus_threshold=20.0) -> Tensor"
    )
    lib.impl("fused_sigmoid_gating_delta_rule_update_cpu", fused_sigmoid_gating_delta_rule_update_cpu, "CPU")
    _library = lib


def fused_gdn_gating_cpu(
    A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN gates of ``[tokens, heads]`` inputs: ``g = -exp(A_log) * softplus(a + dt_bias)`` and
    ``beta = sigmoid(b)``, each ``[1, tokens, heads]`` float32 (softplus with beta 1, linear above 20)."""
    x = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * F.softplus(x, beta=1.0, threshold=20.0)
    return g.unsqueeze(0), torch.sigmoid(b.float()).unsqueeze(0)


def fused_sigmoid_gating_delta_rule_update_cpu(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    initial_state_source: torch.Tensor,
    initial_state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    use_qk_l2norm_in_kernel: bool,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> torch.Tensor:
    """Decode: the gates from raw ``a``/``b`` (``[tokens, HV]``), then the delta rule (see the module doc).

    Args:
        q, k: ``[1, tokens, H, K]``; v: ``[1, tokens, HV, V]``; sequences packed by ``cu_seqlens``.
        initial_state_source: ``[slots, HV, V, K]``. MUTATED: each sequence's slot (non-negative index).
        initial_state_indices: ``[sequences]`` slot per sequence.

    Returns:
        ``[1, tokens, HV, V]`` in ``q``'s dtype.
    """
    x = a.reshape(-1, a.shape[-1]).float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    beta = torch.sigmoid(b.reshape(-1, b.shape[-1]).float())
    out, _ = _delta_rule(q, k, v, g, beta, initial_state_source, initial_state_indices, cu_seqlens,
                         use_qk_l2norm_in_kernel)  # fmt: skip
    return out


def chunk_gated_delta_rule_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    initial_state_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, None]:
    """Prefill: the delta rule over each sequence with precomputed gates ``g`` (log decay) and ``beta``
    (``[1, tokens, HV]``), starting from and writing back to the sequences' state slots.

    Args:
        initial_state: ``[slots, HV, V, K]``. MUTATED: each sequence's slot (non-negative index).
        initial_state_indices: ``[sequences]`` slot per sequence; None: sequence ``i`` uses slot ``i``.

    Returns:
        ``([1, tokens, HV, V]`` output, ``[sequences, HV, V, K]`` final states, None), as SGLang's CPU wrapper.

    Raises:
        ValueError: a head-first layout (SGLang passes ``head_first=False``).
    """
    if head_first:
        raise ValueError("chunk_gated_delta_rule_cpu takes [batch, tokens, heads, dim] tensors (head_first=False)")
    sequences = int(cu_seqlens.numel()) - 1
    indices = initial_state_indices if initial_state_indices is not None else torch.arange(sequences)
    out, finals = _delta_rule(q, k, v, g.reshape(-1, g.shape[-1]).float(), beta.reshape(-1, beta.shape[-1]).float(),
                              initial_state, indices, cu_seqlens, use_qk_l2norm_in_kernel)  # fmt: skip
    return out, finals, None


def _delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    pool: torch.Tensor,
    indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    l2norm: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence of the module doc over packed sequences; ``g`` and ``beta`` are ``[tokens, HV]`` float32.
    MUTATES ``pool`` (the slots of non-negative ``indices``). Returns the output and each sequence's final state."""
    heads, key_dim = int(q.shape[-2]), int(q.shape[-1])
    value_heads, value_dim = int(v.shape[-2]), int(v.shape[-1])
    group = value_heads // heads
    qs = q.reshape(-1, heads, key_dim).float().repeat_interleave(group, dim=1)  # [tokens, HV, K]
    ks = k.reshape(-1, heads, key_dim).float().repeat_interleave(group, dim=1)
    vs = v.reshape(-1, value_heads, value_dim).float()  # [tokens, HV, V]
    if l2norm:
        qs = qs * torch.rsqrt((qs * qs).sum(-1, keepdim=True) + 1e-6)
        ks = ks * torch.rsqrt((ks * ks).sum(-1, keepdim=True) + 1e-6)
    qs = qs * key_dim**-0.5
    out = torch.zeros(vs.shape, dtype=torch.float32)
    starts = [int(x) for x in cu_seqlens.tolist()]
    finals = []
    for n, (begin, end) in enumerate(itertools.pairwise(starts)):
        slot = int(indices[n])
        state = pool[slot].float().clone() if slot >= 0 else torch.zeros(value_heads, value_dim, key_dim)
        for t in range(begin, end):
            state *= torch.exp(g[t])[:, None, None]
            update = beta[t][:, None] * (vs[t] - torch.einsum("hvk,hk->hv", state, ks[t]))
            state += update[:, :, None] * ks[t][:, None, :]
            out[t] = torch.einsum("hvk,hk->hv", state, qs[t])
        if slot >= 0:
            pool[slot] = state.to(pool.dtype)
        finals.append(state)
    final = torch.stack(finals) if finals else torch.zeros(0, value_heads, value_dim, key_dim)
    return out.reshape(*v.shape).to(q.dtype), final


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
        NotImplementedError: a target-verify call (``intermediate_conv_window`` given), naming it.
    """
    if intermediate_conv_window is not None:
        raise NotImplementedError(f"{MAMBA_MODULE}.causal_conv1d_update_cpu (speculative target verify) on CPU")
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
