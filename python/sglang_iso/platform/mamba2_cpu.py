"""Torch stand-ins for the ops of Mamba2 layers (Nemotron-H, Falcon-H1) on CPU.

SGLang's Mamba2 mixer (``sglang.srt.layers.attention.mamba.mamba.MambaMixer2``) binds its convolution ops
(``causal_conv1d_fn`` / ``causal_conv1d_update`` and their ``_triton`` twins) at import only for CUDA, NPU and XPU;
on CPU the names stay unbound and the first forward raises ``NameError``. :func:`apply` binds all four, when that
module is imported and only where the CPU shims apply, to the torch versions of
:mod:`sglang_iso.platform.linear_attn_cpu` (the same contract: ``x`` ``(dim, tokens)`` with ``query_start_loc`` for
prefill, ``(batch, dim)`` for decode, state lines ``(dim, width - 1)`` updated in place, pad lines skipped), and
its state-space scan (``mamba_chunk_scan_combined`` for prefill, ``selective_state_update`` for decode: SGLang's
Triton, whose prefill wrapper enters ``torch.cpu.device``, which does not exist) to the torch versions here.

The scan, per sequence, head ``h`` (group ``g = h // (H / G)``), state ``S`` ``(P, N)`` (the sequence's initial
state or zeros), per token ``t``::

    dt = clamp(softplus(dt_t[h] + dt_bias[h]), *dt_limit)        (softplus with dt_softplus)
    S = S * exp(dt * A[h]) + dt * outer(x_t[h], B_t[g])
    y_t[h] = S C_t[g] + D[h] * x_t[h]                              (times silu(z_t[h]) with z)

and each sequence's final ``S`` is its varlen state; the chunked Triton form is the same recurrence regrouped
(the kernel tests compare both in Triton's interpreter). Decode applies one step to each request's state line in
place. Not here: tracked intermediate states (the ``extra_buffer`` state strategy, which CPU does not run) and the
speculative target-verify forms: each raises naming itself. Nothing on disk changes.
"""

from __future__ import annotations

import itertools
import types
from typing import Any

import torch
import torch.nn.functional as F

from sglang_iso.platform import linear_attn_cpu
from sglang_iso.platform.import_patch import ShimOnImport

MIXER_MODULE = "sglang.srt.layers.attention.mamba.mamba"
CONV_NAMES = ("causal_conv1d_fn", "causal_conv1d_fn_triton")
UPDATE_NAMES = ("causal_conv1d_update", "causal_conv1d_update_triton")
PAD_SLOT_ID = -1


def apply() -> bool:
    """Bind the mixer's convolution and scan names (now, or when its module is imported). Idempotent; False with
    CUDA."""
    return _MIXER_SHIM.apply()


def patch_mixer_module(module: types.ModuleType) -> None:
    """Point :data:`MIXER_MODULE`'s convolution and scan names at the torch versions (idempotent)."""
    for name in CONV_NAMES:
        setattr(module, name, linear_attn_cpu.causal_conv1d_fn_cpu)
    for name in UPDATE_NAMES:
        setattr(module, name, linear_attn_cpu.causal_conv1d_update_cpu)
    module.mamba_chunk_scan_combined = mamba_chunk_scan_combined_cpu  # type: ignore[attr-defined]
    module.selective_state_update = selective_state_update_cpu  # type: ignore[attr-defined]


def _step_sizes(dt: torch.Tensor, dt_bias: torch.Tensor | None, softplus: bool) -> torch.Tensor:
    steps = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
    return F.softplus(steps) if softplus else steps  # NOTE: threshold 20 as the kernels'


def _per_head(groups: torch.Tensor, heads: int) -> torch.Tensor:
    """``(..., G, N)`` -> ``(..., H, N)``: each head reads its group's row."""
    return groups.float().repeat_interleave(heads // int(groups.shape[-2]), dim=-2)


def mamba_chunk_scan_combined_cpu(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    out: torch.Tensor | None = None,
    return_final_states: bool = False,
    return_varlen_states: bool = False,
    return_intermediate_states: bool = False,
    state_dtype: torch.dtype | None = None,
    return_track_states: bool = False,
    track_seq_idx: torch.Tensor | None = None,
    track_end_locs: torch.Tensor | None = None,
    **_chunking: Any,
) -> Any:
    """Prefill scan of a packed batch (see the module doc), in the mixer's form.

    Args:
        x: ``(1, T, H, P)``; dt: ``(1, T, H)``; A: ``(H,)``; B, C: ``(1, T, G, N)``.
        chunk_size: unused (the chunking does not change the result); so are ``seq_idx``, ``chunk_indices``,
            ``chunk_offsets`` (``_chunking``).
        D: ``(H,)`` or ``(H, P)``; z: ``(1, T, H, P)`` or None; dt_bias: ``(H,)``.
        initial_states: ``(sequences, H, P, N)`` or None (zeros).
        cu_seqlens: ``(sequences + 1,)`` token offsets.
        out: ``(1, T, H, P)``. MUTATED: the outputs.

    Returns:
        The varlen states ``(sequences, H, P, N)`` in ``state_dtype``; with ``return_track_states`` the mixer's
        triple ``(None, varlen states, None)`` (no chunk states: nothing tracks them without a tracking mask).

    Raises:
        NotImplementedError: a form the mixer does not use on CPU (no varlen states, final or intermediate states
            asked for, tracked positions given), naming it.
    """
    del chunk_size
    tracked = track_seq_idx is not None and track_end_locs is not None and track_end_locs.numel() > 0
    if not return_varlen_states or cu_seqlens is None or return_final_states or return_intermediate_states or tracked:
        raise NotImplementedError(
            "mamba_chunk_scan_combined on CPU: only the varlen form without final, intermediate or tracked states"
        )
    heads = int(x.shape[2])
    xs, steps = x[0].float(), _step_sizes(dt[0], dt_bias, dt_softplus).clamp(dt_limit[0], dt_limit[1])
    bs, cs, decay = _per_head(B[0], heads), _per_head(C[0], heads), A.float()
    ys = torch.empty_like(xs)
    finals = []
    for i, (begin, end) in enumerate(itertools.pairwise(int(v) for v in cu_seqlens.tolist())):
        state = (
            initial_states[i].float().clone()
            if initial_states is not None
            else xs.new_zeros(heads, int(x.shape[3]), int(B.shape[3]))
        )
        for t in range(begin, end):
            state = (
                state * torch.exp(steps[t] * decay)[:, None, None]
                + (steps[t][:, None] * xs[t])[..., None] * bs[t][:, None, :]
            )
            ys[t] = (state * cs[t][:, None, :]).sum(-1)
        finals.append(state)
    if D is not None:
        ys = ys + xs * (D.float()[:, None] if D.dim() == 1 else D.float())
    if z is not None:
        ys = ys * F.silu(z[0].float())
    if out is None:
        out = torch.empty_like(x)
    out.copy_(ys.unsqueeze(0).to(out.dtype))
    varlen = torch.stack(finals).to(state_dtype or x.dtype)
    return (None, varlen, None) if return_track_states else varlen


def selective_state_update_cpu(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = PAD_SLOT_ID,
    out: torch.Tensor | None = None,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    **_verify: Any,
) -> torch.Tensor:
    """One decode step per request, in place on its state line (see the module doc).

    Args:
        state: ``(lines, H, P, N)``. MUTATED: each request's line (pad lines skipped).
        x: ``(batch, H, P)``; dt, dt_bias: ``(batch, H, P)`` and ``(H, P)`` (per head, repeated over ``P``);
        A: ``(H, P, N)``; B, C: ``(batch, G, N)``; D: ``(H, P)``; z: like ``x`` or None.
        state_batch_indices: ``(batch,)`` line per request; None: request ``i`` uses line ``i``.
        out: like ``x``. MUTATED: the outputs of the requests served (pad rows left as they were).

    Returns:
        ``out``.

    Raises:
        NotImplementedError: the speculative target-verify form (several tokens per request, no state update, an
            intermediate buffer), naming it.
    """
    if x.dim() != 3 or disable_state_update or intermediate_states_buffer is not None:
        raise NotImplementedError("selective_state_update on CPU: the speculative target-verify form")
    heads = int(x.shape[1])
    steps = _step_sizes(dt, dt_bias, dt_softplus)  # (batch, H, P)
    decay = torch.exp(A.float() * steps[..., None])  # (batch, H, P, N)
    bs, cs = _per_head(B, heads), _per_head(C, heads)
    if out is None:
        out = torch.zeros_like(x)
    lines = state_batch_indices.tolist() if state_batch_indices is not None else list(range(int(x.shape[0])))
    for i, line in enumerate(int(v) for v in lines):
        if line == pad_slot_id:
            continue
        updated = state[line].float() * decay[i] + (steps[i] * x[i].float())[..., None] * bs[i][:, None, :]
        state[line] = updated.to(state.dtype)
        y = (updated * cs[i][:, None, :]).sum(-1)
        if D is not None:
            y = y + x[i].float() * D.float()
        if z is not None:
            y = y * F.silu(z[i].float())
        out[i] = y.to(out.dtype)
    return out


_MIXER_SHIM = ShimOnImport([MIXER_MODULE], patch_mixer_module)
