"""Patch a module right after it is imported, without touching any installed file.

:func:`patch_on_import` patches the listed modules already in ``sys.modules`` at
once and puts a ``sys.meta_path`` finder in front for the others: it wraps their
loader so ``patch(module)`` runs right after the module's own code. Costs nothing
until one of them is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

Patch = Callable[[types.ModuleType], None]


class ShimOnImport:
    """One CPU shim: ``patch`` applied to ``names`` on import, only where the CPU shims apply; idempotent.

    ``before`` (optional) runs once, just before the import patch is installed.
    """

    def __init__(self, names: Sequence[str], patch: Patch, before: Callable[[], None] | None = None) -> None:
        self.names = tuple(names)
        self.patch = patch
        self.before = before
        self.applied = False

    def apply(self) -> bool:
        """Install the shim (now, or when a module is imported). True if active; False with CUDA."""
        from sglang_iso.platform import cpu

        if self.applied:
            return True
        if not cpu.should_apply():
            return False
        if self.before is not None:
            self.before()
        patch_on_import(self.names, self.patch)
        self.applied = True
        return True


def patch_on_import(names: Sequence[str], patch: Patch) -> None:
    """Apply ``patch`` to each module in ``names``: now if imported, else right after its import."""
    pending = [name for name in names if name not in sys.modules]
    for name in names:
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
    if pending:
        sys.meta_path.insert(0, _PatchAfterImport(pending, patch))


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of each listed module so the module is patched right after it executes."""

    def __init__(self, names: Sequence[str], patch: Patch) -> None:
        self._names = frozenset(names)
        self._patch = patch

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
                spec.loader = _PatchingLoader(spec.loader, self._patch)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Patch) -> None:
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, ...: tracebacks and inspect still find the module's source.
        return getattr(self._inner, name)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        self._patch(module)
