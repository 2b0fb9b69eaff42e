"""The CPU LoRA shim: pinning is neutralised in SGLang's LoRA modules only, and only without CUDA."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from sglang_iso.platform import lora_cpu


def test_active_without_cuda() -> None:
    assert not torch.cuda.is_available()
    assert lora_cpu.apply() and lora_cpu.is_applied()
    assert lora_cpu.apply()  # idempotent


@pytest.mark.parametrize("name", lora_cpu.UNPINNED_MODULES)
def test_lora_modules_get_the_unpinned_torch(name: str) -> None:
    lora_cpu.apply()
    module = importlib.import_module(name)
    assert isinstance(module.torch, lora_cpu.UnpinnedTorch)
    t = module.torch.zeros(3, dtype=torch.int32, pin_memory=True)
    assert t.tolist() == [0, 0, 0] and not t.is_pinned()
    assert module.torch.tensor([1, 2], pin_memory=True, device="cpu").tolist() == [1, 2]
    assert module.torch.int32 is torch.int32 and module.torch.Tensor is torch.Tensor


def test_pin_memory_method_is_a_no_op_only_inside_lora_modules() -> None:
    lora_cpu.apply()
    module = importlib.import_module("sglang.srt.lora.layers")
    code = compile("def pin(t):\n    return t.pin_memory()\n", "<lora>", "exec")
    scope: dict[str, object] = {"__name__": module.__name__}
    exec(code, scope)
    t = torch.ones(2)
    assert scope["pin"](t) is t  # type: ignore[operator]
    with pytest.raises(RuntimeError):
        t.pin_memory()  # anywhere else: torch's own behaviour without an accelerator


def test_modules_imported_after_apply_are_patched_by_the_finder() -> None:
    lora_cpu.apply()
    name = "sglang.srt.lora.backend.chunked_backend"
    saved = sys.modules.pop(name, None)
    try:
        module = importlib.import_module(name)
        assert isinstance(module.torch, lora_cpu.UnpinnedTorch)
        assert module.__loader__.get_source(name)  # type: ignore[union-attr]
    finally:
        if saved is not None:
            sys.modules[name] = saved
