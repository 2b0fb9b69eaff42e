"""A torch version of the shared-expert gate of Qwen MoE layers on CPU.

SGLang's ``Qwen2MoeSparseMoeBlock`` (also the MoE block of Qwen3-Next) gates its shared expert with
``fused_gate_sigmoid_mul`` / ``fused_gate_sigmoid_mul_add`` (``sglang.kernels.ops.elementwise.elementwise``), one
Triton program per token: on CPU it runs only under ``TRITON_INTERPRET=1``, slowly (a program per prompt token per
layer). :func:`apply` binds the two names in the model module (``sglang.srt.models.qwen2_moe``, which imported them)
to :func:`gate_sigmoid_mul_cpu` and :func:`gate_sigmoid_mul_add_cpu`, only where the CPU shims apply: per row,
``sigmoid(sum(h * w))`` times the shared expert's output, in float32 as the kernel computes it, stored in the
output's dtype (added in place to the routed experts' output for the ``_add`` form). Nothing on disk changes.
"""

from __future__ import annotations

import types

import torch

from sglang_iso.platform.import_patch import ShimOnImport

MOE_MODULE = "sglang.srt.models.qwen2_moe"


def apply() -> bool:
    """Bind the shared-expert gate of :data:`MOE_MODULE` to torch (now, or when it is imported). Idempotent;
    False with CUDA."""
    return _GATE_SHIM.apply()


def patch_moe_module(module: types.ModuleType) -> None:
    """Point :data:`MOE_MODULE`'s two gate names at the torch versions (idempotent)."""
    module.fused_gate_sigmoid_mul = gate_sigmoid_mul_cpu  # type: ignore[attr-defined]
    module.fused_gate_sigmoid_mul_add = gate_sigmoid_mul_add_cpu  # type: ignore[attr-defined]


def _gated(hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor) -> torch.Tensor:
    _check(hidden_states, gate_weight, shared_output)
    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float())
    return gate.unsqueeze(-1) * shared_output.float()


def gate_sigmoid_mul_cpu(
    hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor
) -> torch.Tensor:
    """``sigmoid(hidden_states @ gate_weight)[:, None] * shared_output``, a new tensor of ``shared_output``'s
    dtype."""
    return _gated(hidden_states, gate_weight, shared_output).to(shared_output.dtype)


def gate_sigmoid_mul_add_cpu(
    hidden_states: torch.Tensor,
    gate_weight: torch.Tensor,
    shared_output: torch.Tensor,
    final_hidden_states: torch.Tensor,
) -> None:
    """``final_hidden_states += sigmoid(hidden_states @ gate_weight)[:, None] * shared_output``, in place (the sum
    in float32)."""
    if final_hidden_states.shape != shared_output.shape:
        raise ValueError(f"gate output shape {tuple(final_hidden_states.shape)} != {tuple(shared_output.shape)}")
    total = _gated(hidden_states, gate_weight, shared_output) + final_hidden_states.float()
    final_hidden_states.copy_(total.to(final_hidden_states.dtype))


def _check(hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor) -> None:
    """The kernel's shape contract: ``[tokens, hidden]`` rows, a ``[hidden]`` gate vector."""
    if hidden_states.dim() != 2 or gate_weight.shape != (hidden_states.shape[1],):
        raise ValueError(f"gate weight {tuple(gate_weight.shape)} for hidden states {tuple(hidden_states.shape)}")
    if shared_output.shape != hidden_states.shape:
        raise ValueError(f"shared output {tuple(shared_output.shape)} != {tuple(hidden_states.shape)}")


_GATE_SHIM = ShimOnImport([MOE_MODULE], patch_moe_module)
