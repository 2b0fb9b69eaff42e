"""Interpreter-start hook: the CPU shims before the first ``sglang`` or ``torchvision`` import.

A one-line ``.pth`` file in the environment's site-packages (written by
``sglang-iso cpu-hook install``, which ``make install`` runs) calls
:func:`install` when the interpreter starts. That puts a finder at the front of
``sys.meta_path`` which imports nothing and costs one set lookup per import.
The first time anything imports one of ``TRIGGER_MODULES``, the finder removes
itself and runs :func:`sglang_iso.platform.cpu.apply`, which imports torch,
returns at once when CUDA is available, and otherwise installs the shims. Then
the import continues normally. So ``import sglang``, ``import torchvision``, a
frontend-language program or ``python -m sglang.launch_server`` work in a CPU
environment without importing ``sglang_iso`` first.

``SGLANG_ISO_NO_CPU_HOOK=1`` turns the hook off for a process.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from sglang_iso import envvars

logger = logging.getLogger(__name__)

# Top-level modules whose import needs the shims on a CPU-only torch.
TRIGGER_MODULES = frozenset({"sglang", "torchvision"})
PTH_NAME = "sglang_iso_cpu_hook.pth"
# NOTE: one line, executed by site.py at every interpreter start; it must never raise (a broken line
# prints a traceback in every process), so a removed package or a failing import is ignored.
PTH_LINE = (
    'import sys; exec("try:\\n import sglang_iso.platform.startup as _s; _s.install()\\nexcept Exception:\\n pass")\n'
)


class ShimOnFirstImport:
    """A meta-path finder that applies the CPU shims on the first trigger import, then leaves."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in TRIGGER_MODULES:
            return None
        uninstall()
        from sglang_iso.platform import cpu

        try:
            cpu.apply()
        except Exception:  # NOTE: the import itself will then fail with its own, clearer error
            logger.exception("sglang-iso: CPU shims could not be applied")
        return None  # the regular finders import the module


def install() -> bool:
    """Put the finder in front of ``sys.meta_path`` (idempotent). False when disabled or not needed."""
    if os.environ.get(envvars.NO_CPU_HOOK.name) == "1":
        return False
    if any(isinstance(f, ShimOnFirstImport) for f in sys.meta_path):
        return True
    if any(name in sys.modules for name in TRIGGER_MODULES):
        return False  # too late to help this process; the entry points apply the shims themselves
    sys.meta_path.insert(0, ShimOnFirstImport())
    return True


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, ShimOnFirstImport)]


def pth_path(site_packages: str | None = None) -> Path:
    """Where the hook's ``.pth`` file lives for this interpreter (or under ``site_packages``)."""
    return Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME


def write_pth(site_packages: str | None = None) -> Path:
    path = pth_path(site_packages)
    path.write_text(PTH_LINE)
    return path


def remove_pth(site_packages: str | None = None) -> bool:
    path = pth_path(site_packages)
    if not path.exists():
        return False
    path.unlink()
    return True
