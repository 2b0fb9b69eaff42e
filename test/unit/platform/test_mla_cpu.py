"""The CPU MLA shim: torch_native takes the absorbed MLA path, and MTP's head sharing skips the CUDA sync."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

from sglang_iso.platform import mla_cpu

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the shim applies only without CUDA")


def test_torch_native_gets_the_absorbed_mla_path_for_every_pass() -> None:
    assert mla_cpu.apply() and mla_cpu.apply()  # idempotent
    handlers = importlib.import_module(mla_cpu.HANDLER_MODULE)
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    registry = handlers.AttentionBackendRegistry
    ours = registry.get_handler("torch_native")
    assert ours is not registry.get_handler("triton")  # without the shim torch_native falls back to Triton's
    fresh_prefill = SimpleNamespace(forward_mode=None, extend_prefix_lens_cpu=[0])
    assert ours(SimpleNamespace(), fresh_prefill) == AttnForwardMethod.MLA
    mla_cpu.patch_module(handlers)  # idempotent: the handler registered first stays
    assert registry.get_handler("torch_native") is ours


def test_mtp_head_sharing_runs_without_cuda() -> None:
    assert mla_cpu.apply()
    model = importlib.import_module(mla_cpu.MODEL_MODULE).DeepseekV2ForCausalLM
    assert getattr(model.set_embed_and_head, "_sglang_iso_cpu", False)
    target = SimpleNamespace(model=SimpleNamespace(embed_tokens=torch.nn.Linear(2, 2)), lm_head=torch.nn.Linear(2, 2))
    embed, head = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.zeros(2, 2))
    model.set_embed_and_head(target, embed, head)
    assert target.model.embed_tokens.weight is embed and target.lm_head.weight is head
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.synchronize()  # restored: the real call still fails loudly on a CPU-only torch
