"""The torch stand-in for the shared-expert gate of Qwen MoE layers, against SGLang's Triton kernel.

The oracle is SGLang's ``fused_gate_sigmoid_mul`` / ``fused_gate_sigmoid_mul_add`` in the interpreter
(``TRITON_INTERPRET=1``, set by this folder's conftest), on random rows per seed in float32 and bfloat16, including a
hidden width that is not a power of two (the kernel masks the block's tail).
"""

from __future__ import annotations

import pytest
import torch

from sglang_iso.platform import moe_gate_cpu
from test.kernels.conftest import SEEDS, TRITON_RUNNABLE

pytestmark = pytest.mark.skipif(not TRITON_RUNNABLE, reason="Triton cannot run here")

SHAPES = ((7, 64), (3, 48))
"""(tokens, hidden): a power-of-two width and one the kernel's block masks."""
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _rows(seed: int, tokens: int, hidden: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    hidden_states, shared, routed = (torch.randn(tokens, hidden, generator=gen).to(dtype) for _ in range(3))
    weight = (torch.randn(hidden, generator=gen) / hidden**0.5).to(dtype)
    return hidden_states, weight, shared, routed


@pytest.mark.parametrize("dtype", sorted(TOLERANCE, key=str))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_gate_matches_triton(seed: int, shape: tuple[int, int], dtype: torch.dtype) -> None:
    from sglang.kernels.ops.elementwise.elementwise import fused_gate_sigmoid_mul

    hidden_states, weight, shared, _ = _rows(seed, *shape, dtype)
    ours = moe_gate_cpu.gate_sigmoid_mul_cpu(hidden_states, weight, shared)
    theirs = fused_gate_sigmoid_mul(hidden_states, weight, shared)
    assert ours.dtype == theirs.dtype == dtype
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert not torch.equal(ours, shared)  # control: the gate changed the rows


@pytest.mark.parametrize("dtype", sorted(TOLERANCE, key=str))
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_gate_add_matches_triton_in_place(seed: int, shape: tuple[int, int], dtype: torch.dtype) -> None:
    from sglang.kernels.ops.elementwise.elementwise import fused_gate_sigmoid_mul_add

    hidden_states, weight, shared, routed = _rows(seed, *shape, dtype)
    ours, theirs = routed.clone(), routed.clone()
    moe_gate_cpu.gate_sigmoid_mul_add_cpu(hidden_states, weight, shared, ours)
    fused_gate_sigmoid_mul_add(hidden_states, weight, shared, theirs)
    torch.testing.assert_close(ours, theirs, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    assert not torch.equal(ours, routed)  # control: the routed output was added to


def test_shapes_outside_the_kernels_contract_are_refused_naming_them() -> None:
    hidden_states, weight, shared, routed = _rows(0, 4, 16, torch.float32)
    with pytest.raises(ValueError, match="gate weight"):
        moe_gate_cpu.gate_sigmoid_mul_cpu(hidden_states, weight[:8], shared)
    with pytest.raises(ValueError, match="shared output"):
        moe_gate_cpu.gate_sigmoid_mul_cpu(hidden_states, weight, shared[:2])
    with pytest.raises(ValueError, match="gate output shape"):
        moe_gate_cpu.gate_sigmoid_mul_add_cpu(hidden_states, weight, shared, routed[:2])


def test_the_model_module_is_bound_to_the_torch_gate() -> None:
    """After :func:`moe_gate_cpu.apply` (the platform bootstrap's), the Qwen MoE module's names are ours."""
    import importlib

    moe_gate_cpu.apply()
    module = importlib.import_module(moe_gate_cpu.MOE_MODULE)
    assert module.fused_gate_sigmoid_mul is moe_gate_cpu.gate_sigmoid_mul_cpu
    assert module.fused_gate_sigmoid_mul_add is moe_gate_cpu.gate_sigmoid_mul_add_cpu
