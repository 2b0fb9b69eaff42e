"""CPU compatibility for SGLang's LoRA code: no pinned host memory without an accelerator.

SGLang's LoRA layers and its batch-info backends allocate small host tensors with
``pin_memory=True`` (or call ``Tensor.pin_memory()``) unconditionally. A CPU-only
torch has no pinned allocator and raises, so LoRA cannot serve. Here, only on a
machine without CUDA (:func:`sglang_iso.platform.cpu.should_apply`):

* the ``torch`` name inside each module of :data:`UNPINNED_MODULES` is replaced by
  a proxy whose tensor factories drop ``pin_memory``; every other attribute is
  the real ``torch``'s;
* ``Tensor.pin_memory()`` returns the tensor itself when called from one of those
  modules; from anywhere else it behaves as before.

Modules imported later are patched right after their import (a ``sys.meta_path``
finder), so applying costs no import time. Nothing on disk is changed. Pinning
only speeds up host-to-device copies, and on CPU there is no device copy.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable
from typing import Any

from sglang_iso.platform.import_patch import ShimOnImport

logger = logging.getLogger(__name__)

UNPINNED_MODULES: tuple[str, ...] = (
    "sglang.srt.lora.layers",
    "sglang.srt.lora.backend.chunked_backend",
    "sglang.srt.lora.backend.torch_backend",
)
"""SGLang modules (0.5.23) that pin host memory unconditionally on the LoRA path."""

_FACTORIES = frozenset(
    {"empty", "zeros", "ones", "full", "arange", "tensor", "as_tensor", "empty_like", "zeros_like", "ones_like"}
)


def apply() -> bool:
    """Neutralise pinning in :data:`UNPINNED_MODULES` (now, or when they are imported). Idempotent.

    Returns:
        True if the shim is active (now or from an earlier call); False with CUDA.
    """
    return _SHIM.apply()


def is_applied() -> bool:
    return _SHIM.applied


def patch_module(module: types.ModuleType) -> None:
    """Give ``module`` the unpinned ``torch`` proxy (no-op if already done)."""
    real = getattr(module, "torch", None)
    if isinstance(real, types.ModuleType) and not isinstance(real, UnpinnedTorch):
        module.torch = UnpinnedTorch(real)  # type: ignore[attr-defined]


class UnpinnedTorch(types.ModuleType):
    """``torch`` as a module namespace, except that tensor factories ignore ``pin_memory``."""

    def __init__(self, real: types.ModuleType) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_real"] = real

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.__dict__["_real"], name)
        if name in _FACTORIES and callable(value):
            return _drop_pin(value)
        return value


def _drop_pin(factory: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("pin_memory", None)
        return factory(*args, **kwargs)

    return call


def _scoped_pin_memory(original: Callable[..., Any]) -> Callable[..., Any]:
    scoped = frozenset(UNPINNED_MODULES)

    def pin_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
        # NOTE: only callers in the listed modules are changed, because elsewhere a failing pin
        # may be how code detects that pinning is unavailable.
        caller = sys._getframe(1).f_globals.get("__name__")
        if caller in scoped:
            return self
        return original(self, *args, **kwargs)

    pin_memory.__sglang_iso_unpinned__ = True  # type: ignore[attr-defined]
    return pin_memory


def _unpin_tensor_method() -> None:
    import torch

    original = torch.Tensor.pin_memory
    if not getattr(original, "__sglang_iso_unpinned__", False):
        torch.Tensor.pin_memory = _scoped_pin_memory(original)  # type: ignore[method-assign]


_SHIM = ShimOnImport(UNPINNED_MODULES, patch_module, before=_unpin_tensor_method)
