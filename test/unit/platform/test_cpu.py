"""The CPU shims: torchvision imports, missing kernels fail loudly by name."""

from __future__ import annotations

import sys

import pytest
import torch

from sglang_iso.platform import cpu, spec_cpu


def test_shims_active_without_cuda() -> None:
    assert not torch.cuda.is_available()
    assert cpu.is_applied()


def test_torchvision_imports_and_nms_call_names_the_op() -> None:
    import torchvision  # noqa: F401  (raised at import before the shims)

    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    with pytest.raises(cpu.MissingKernelError, match="torchvision::nms"):
        torch.ops.torchvision.nms(boxes, torch.tensor([1.0]), 0.5)


def test_missing_kernel_raises_naming_the_op() -> None:
    with pytest.raises(cpu.MissingKernelError, match=r"sgl_kernel\.some_cuda_op"):
        cpu.missing_kernel("sgl_kernel.some_cuda_op")(1, 2)


def test_speculative_names_are_torch_standins() -> None:
    stub = sys.modules["sgl_kernel"]
    for name, fn in spec_cpu.STANDINS.items():
        assert getattr(stub, name) is fn
    assert set(cpu.SGL_KERNEL_CPU_NAMES) <= set(spec_cpu.STANDINS)  # every name SGLang imports has one
    assert sys.modules["sgl_kernel.speculative"].reconstruct_indices_from_tree_mask is (
        spec_cpu.reconstruct_indices_from_tree_mask
    )


def test_stub_exposes_only_declared_names() -> None:
    stub = sys.modules["sgl_kernel"]
    assert not hasattr(stub, "some_cuda_only_kernel")
    assert getattr(stub, "__sglang_iso_stub__", False)


def test_amx_backend_stays_off_beside_the_linear_attention_op() -> None:
    import torch
    from sglang.srt.utils import cpu_has_amx_support

    assert hasattr(torch.ops.sgl_kernel, "fused_gdn_gating_cpu")  # control: the namespace is not empty
    assert not cpu_has_amx_support()


def test_linear_attention_names_are_torch_standins() -> None:
    from sglang_iso.platform import linear_attn_cpu

    mamba = sys.modules["sgl_kernel.mamba"]
    assert mamba.causal_conv1d_fn_cpu is linear_attn_cpu.causal_conv1d_fn_cpu
    assert mamba.causal_conv1d_update_cpu is linear_attn_cpu.causal_conv1d_update_cpu
    assert mamba.chunk_gated_delta_rule_cpu is linear_attn_cpu.chunk_gated_delta_rule_cpu


def test_apply_is_idempotent() -> None:
    stub = sys.modules["sgl_kernel"]
    assert cpu.apply()
    assert sys.modules["sgl_kernel"] is stub
