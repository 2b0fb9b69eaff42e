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

import importlib.abc
import importlib.machinery
import logging
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from sglang_iso.platform import cpu

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
_applied = False


def apply() -> bool:
    """Neutralise pinning in :data:`UNPINNED_MODULES` (now, or when they are imported). Idempotent.

    Returns:
        True if the shim is active (now or from an earlier call); False with CUDA.
    """
    global _applied
    if _applied:
        return True
    if not cpu.should_apply():
        return False
    import torch

    original = torch.Tensor.pin_memory
    if not getattr(original, "__sglang_iso_unpinned__", False):
        torch.Tensor.pin_memory = _scoped_pin_memory(original)  # type: ignore[method-assign]
    for name in UNPINNED_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            patch_module(module)
    sys.meta_path.insert(0, _PatchAfterImport(UNPINNED_MODULES))
    _applied = True
    return True


def is_applied() -> bool:
    return _applied


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


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of each listed module so the module is patched right after it executes."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = frozenset(names)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, ...: tracebacks and inspect still find the module's source.
        return getattr(self._inner, name)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        patch_module(module)
        logger.debug("sglang-iso: unpinned host tensors in %s", module.__name__)
