"""CPU compatibility for MLA models (DeepSeek-V3, Kimi K2, GLM-4.7-Flash) on the torch_native backend.

SGLang's DeepSeek attention asks ``AttentionBackendRegistry`` which forward method
to use. There is no ``torch_native`` handler, so it falls back to Triton's, which
picks the MHA path for a fresh prefill: that path passes 192-wide K and V, but
torch_native ignores them and reads the 576-wide latent cache, and SDPA fails on
the shapes (upstream issue #15711). Here, only on a machine without CUDA
(:func:`cpu.should_apply`), ``torch_native`` is registered with the absorbed MLA
path for every pass (the path Triton takes for any pass with a cached prefix):
the latent cache is written and read by the same code.

MTP (NEXTN) shares the target's embedding and head with its draft layer through
``DeepseekV2ForCausalLM.set_embed_and_head``, which ends with
``torch.cuda.synchronize()``; a CPU-only torch raises there. On CPU that call is a
no-op for the duration of the method (nothing runs asynchronously on CPU).

Applied when the modules are imported; nothing on disk changes.
"""

from __future__ import annotations

import types
from typing import Any

from sglang_iso.platform.import_patch import ShimOnImport

HANDLER_MODULE = "sglang.srt.models.deepseek_common.attention_backend_handler"
MODEL_MODULE = "sglang.srt.models.deepseek_v2"
BACKEND = "torch_native"


def apply() -> bool:
    """Install the shim (now, or when the handler module is imported). Idempotent; False with CUDA."""
    return _SHIM.apply()


def patch_module(module: types.ModuleType) -> None:
    """Patch :data:`HANDLER_MODULE` or :data:`MODEL_MODULE` (idempotent)."""
    if module.__name__ == MODEL_MODULE:
        _patch_model(module)
    else:
        _patch_handler(module)


def _patch_handler(module: types.ModuleType) -> None:
    """Register the absorbed-MLA handler for :data:`BACKEND` (no-op if SGLang registers one itself)."""
    registry = module.AttentionBackendRegistry
    if BACKEND in registry._handlers:
        return
    dispatch = module._dispatch_mla_subtype

    def handle_attention_torch_native(attn: Any, forward_batch: Any) -> Any:
        return dispatch(attn, forward_batch)

    registry.register(BACKEND, handle_attention_torch_native)


def _patch_model(module: types.ModuleType) -> None:
    model = module.DeepseekV2ForCausalLM
    method = model.set_embed_and_head
    if getattr(method, "_sglang_iso_cpu", False):
        return

    def set_embed_and_head(self: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        synchronize = torch.cuda.synchronize
        torch.cuda.synchronize = lambda *_a, **_k: None  # type: ignore[assignment]
        try:
            return method(self, *args, **kwargs)
        finally:
            torch.cuda.synchronize = synchronize  # type: ignore[assignment]

    set_embed_and_head._sglang_iso_cpu = True  # type: ignore[attr-defined]
    model.set_embed_and_head = set_embed_and_head


_SHIM = ShimOnImport([HANDLER_MODULE, MODEL_MODULE], patch_module)
