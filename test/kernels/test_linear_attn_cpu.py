"""The torch stand-ins for SGLang's linear-attention convolution and gating ops.

Gates: against SGLang's Triton kernel in the interpreter (``TRITON_INTERPRET=1``, set by this folder's conftest).
Convolutions: against ``torch.nn.functional.conv1d`` applied per sequence to the state-prefixed window, with the
state contract of SGLang's kernel docstrings, because SGLang's convolution kernels do not run in this Triton's
interpreter (a scalar compared inside a mask: "mask has unsupported dtype", checked by the last test, which fails
once they do, so that they can become the oracle). Each scenario is random per seed (ragged sequences, some shorter
than the state; lines with and without an initial state; a padded line); both sides get copies of the same inputs.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from sglang_iso.platform import gated_norm_cpu, linear_attn_cpu
from test.kernels.conftest import SEEDS, TRITON_RUNNABLE

pytestmark = pytest.mark.skipif(not TRITON_RUNNABLE, reason="Triton cannot run here")

DIM, WIDTH, LINES = 24, 4, 8
PAD = linear_attn_cpu.PAD_SLOT_ID


def _pool(gen: torch.Generator, *, transposed: bool) -> torch.Tensor:
    """``(LINES, DIM, WIDTH - 1)`` states; ``transposed``: stored dim-contiguous, as a state pool may be."""
    states = torch.randn(LINES, WIDTH - 1, DIM, generator=gen)
    return states.transpose(1, 2) if transposed else states.transpose(1, 2).contiguous()


def _weights(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(DIM, WIDTH, generator=gen), torch.randn(DIM, generator=gen)


def _oracle(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pool: torch.Tensor, line: int, initial: bool
) -> torch.Tensor:
    """One sequence ``x`` (dim, n) by ``torch.nn.functional.conv1d`` (depthwise, left-padded by the line's state or
    zeros), SiLU; the line becomes the last ``WIDTH - 1`` inputs (the contract in SGLang's kernel docstrings)."""
    prior = pool[line].clone() if initial else torch.zeros(DIM, WIDTH - 1)
    window = torch.cat([prior, x], dim=1)
    pool[line] = window[:, -(WIDTH - 1) :]
    return F.silu(F.conv1d(window[None], weight[:, None, :], bias, groups=DIM)[0])


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_prefill_convolution_matches_conv1d(seed: int, transposed: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    lens = [1, 2, 5, 19, 3]  # shorter and longer than the state (3)
    starts = [0, *torch.tensor(lens).cumsum(0).tolist()]
    x = torch.randn(DIM, sum(lens), generator=gen)
    weight, bias = _weights(gen)
    lines = torch.randperm(LINES, generator=gen)[: len(lens)].to(torch.int32)
    lines[2] = PAD  # a padded entry: skipped, its line untouched
    initial = torch.rand(len(lens), generator=gen) < 0.5
    initial[0], initial[3] = True, False  # both kinds, whatever the seed (a short one from its line too)
    pool = _pool(gen, transposed=transposed)
    ours_pool, want_pool = pool.clone(), pool.clone()
    ours = linear_attn_cpu.causal_conv1d_fn_cpu(
        x, weight, bias, "silu", ours_pool, has_initial_state=initial, cache_indices=lines,
        query_start_loc=torch.tensor(starts, dtype=torch.int32), seq_lens_cpu=lens,
    )  # fmt: skip
    for i, (begin, end) in enumerate(itertools.pairwise(starts)):
        if int(lines[i]) == PAD:
            continue
        want = _oracle(x[:, begin:end], weight, bias, want_pool, int(lines[i]), bool(initial[i]))
        torch.testing.assert_close(ours[:, begin:end], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_pool, want_pool, rtol=0, atol=0)
    assert not torch.equal(ours_pool, pool)  # the states moved (the comparison is not of two untouched pools)


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_decode_convolution_matches_conv1d(seed: int, tokens: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch = 4
    x = torch.randn(batch, DIM, tokens, generator=gen)
    weight, bias = _weights(gen)
    lines = torch.randperm(LINES, generator=gen)[:batch].to(torch.int32)
    lines[1] = PAD
    pool = _pool(gen, transposed=False)
    ours_pool, want_pool = pool.clone(), pool.clone()
    ours = linear_attn_cpu.causal_conv1d_update_cpu(x if tokens > 1 else x[..., 0], ours_pool, weight, bias, "silu",
                                                    lines)  # fmt: skip
    assert ours.shape == (x if tokens > 1 else x[..., 0]).shape
    ours = ours if tokens > 1 else ours[..., None]
    for i, line in enumerate(lines.tolist()):
        if line != PAD:
            want = _oracle(x[i], weight, bias, want_pool, line, True)
            torch.testing.assert_close(ours[i], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_pool, want_pool, rtol=0, atol=0)
    assert not torch.equal(ours_pool, pool)


def test_decode_target_verify_names_itself() -> None:
    pool = torch.zeros(2, DIM, WIDTH - 1)
    with pytest.raises(NotImplementedError, match="target verify"):
        linear_attn_cpu.causal_conv1d_update_cpu(
            torch.zeros(1, DIM), pool, torch.zeros(DIM, WIDTH), None, "silu", torch.tensor([0]),
            intermediate_conv_window=torch.zeros(1, 1, DIM, WIDTH - 1),
        )  # fmt: skip


@pytest.mark.parametrize("seed", SEEDS)
def test_gating_matches_triton(seed: int) -> None:
    from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating

    gen = torch.Generator().manual_seed(seed)
    tokens, heads = 7, 6
    a = torch.randn(tokens, heads, generator=gen) * 10
    a[0, 0] = 30.0  # softplus past its threshold: the linear branch
    b = torch.randn(tokens, heads, generator=gen)
    a_log, dt_bias = torch.randn(heads, generator=gen), torch.randn(heads, generator=gen)
    g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(a_log, a, b, dt_bias)
    want_g, want_beta = fused_gdn_gating(a_log, a, b, dt_bias)
    assert g.shape == want_g.shape == (1, tokens, heads) and g.dtype == want_g.dtype
    torch.testing.assert_close(g, want_g, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(beta, want_beta, rtol=1e-6, atol=1e-6)


H, HV, K, V, SLOTS = 2, 4, 16, 8, 6


def _delta_inputs(gen: torch.Generator, tokens: int) -> dict[str, torch.Tensor]:
    return {
        "q": torch.randn(1, tokens, H, K, generator=gen),
        "k": torch.randn(1, tokens, H, K, generator=gen),
        "v": torch.randn(1, tokens, HV, V, generator=gen),
        "a": torch.randn(tokens, HV, generator=gen),
        "b": torch.randn(tokens, HV, generator=gen),
        "A_log": torch.randn(HV, generator=gen) * 0.5,
        "dt_bias": torch.randn(HV, generator=gen) * 0.5,
    }


def _triton_delta_rule(x: dict[str, torch.Tensor], pool: torch.Tensor, slots: torch.Tensor, cu: torch.Tensor):  # type: ignore[no-untyped-def]
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    return fused_sigmoid_gating_delta_rule_update(
        A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], softplus_beta=1.0, softplus_threshold=20.0, q=x["q"],
        k=x["k"], v=x["v"], b=x["b"], initial_state_source=pool, initial_state_indices=slots,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
    )  # fmt: skip


@pytest.mark.parametrize("seed", SEEDS)
def test_decode_delta_rule_matches_triton(seed: int) -> None:
    """One token per request (the decode op SGLang binds from ``torch.ops.sgl_kernel``); a request without a slot
    (-1) starts from zeros and writes nothing back."""
    gen = torch.Generator().manual_seed(seed)
    x = _delta_inputs(gen, 4)
    slots = torch.tensor([4, 1, -1, 2], dtype=torch.int32)
    cu = torch.arange(5, dtype=torch.int32)
    pool = torch.randn(SLOTS, HV, V, K, generator=gen)
    ours_pool, theirs_pool = pool.clone(), pool.clone()
    ours = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=x["A_log"], dt_bias=x["dt_bias"], q=x["q"], k=x["k"], v=x["v"], a=x["a"], b=x["b"],
        initial_state_source=ours_pool, initial_state_indices=slots, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0,
    )  # fmt: skip
    theirs = _triton_delta_rule(x, theirs_pool, slots, cu)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours_pool, theirs_pool, rtol=1e-4, atol=1e-5)
    assert not torch.equal(ours_pool, pool)


@pytest.mark.parametrize("seed", SEEDS)
def test_prefill_delta_rule_matches_the_triton_recurrence(seed: int) -> None:
    """Ragged prefill sequences through the prefill op (gates from the gating op) equal SGLang's recurrent Triton
    kernel over the same tokens (SGLang's chunked kernel does not run in the interpreter, and the chunked form is
    the same recurrence regrouped)."""
    gen = torch.Generator().manual_seed(seed)
    lens = [1, 6, 3]
    x = _delta_inputs(gen, sum(lens))
    slots = torch.tensor([3, 0, 5], dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    pool = torch.randn(SLOTS, HV, V, K, generator=gen)
    ours_pool, theirs_pool = pool.clone(), pool.clone()
    g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(x["A_log"], x["a"], x["b"], x["dt_bias"])
    ours, finals, h = linear_attn_cpu.chunk_gated_delta_rule_cpu(
        x["q"], x["k"], x["v"], g, beta, ours_pool, cu, False, True, slots
    )
    theirs = _triton_delta_rule(x, theirs_pool, slots, cu)
    assert h is None and ours.shape == theirs.shape == (1, sum(lens), HV, V)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours_pool, theirs_pool, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(finals, theirs_pool[slots.long()], rtol=1e-4, atol=1e-5)
    assert not torch.equal(ours_pool, pool)


def test_sglang_convolution_kernels_still_fail_in_the_interpreter() -> None:
    """Why the convolutions have a torch oracle: when this fails, SGLang's kernel runs here and should be the
    oracle of the two tests above instead."""
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
    from triton.runtime.errors import InterpreterError

    pool = torch.zeros(LINES, DIM, WIDTH - 1)
    with pytest.raises(InterpreterError, match="mask has unsupported dtype"):
        causal_conv1d_update(torch.zeros(2, DIM), pool, torch.zeros(DIM, WIDTH), None, "silu",
                             conv_state_indices=torch.tensor([1, 3], dtype=torch.int32))  # fmt: skip


@pytest.mark.parametrize("seed", SEEDS)
def test_gated_rms_norm_matches_the_reference_model(seed: int) -> None:
    """SGLang's ``FusedRMSNormGated`` (its Triton path replaced on CPU) against Hugging Face's Qwen3-Next gated
    RMSNorm, an implementation of the same layer that shares no code with either."""
    from sglang.kernels.ops.attention.fla import fused_norm_gate
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

    assert gated_norm_cpu.apply()
    assert fused_norm_gate.rms_norm_gated is gated_norm_cpu.rms_norm_gated_cpu  # the shim is what runs below
    gen = torch.Generator().manual_seed(seed)
    x, gate = torch.randn(5, 4, V, generator=gen), torch.randn(5, 4, V, generator=gen)
    weight = torch.randn(V, generator=gen)
    ours = fused_norm_gate.FusedRMSNormGated(V, eps=1e-6, activation="silu")
    theirs = Qwen3NextRMSNormGated(V, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
        torch.testing.assert_close(ours(x, gate), theirs(x, gate), rtol=1e-5, atol=1e-6)
