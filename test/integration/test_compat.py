"""Every SGLang symbol sglang-iso hooks still exists with the parameters we rely on."""

from __future__ import annotations

import inspect
import pkgutil
from importlib.metadata import version

import pytest

from sglang_iso.integration.symbols import HOOKED_SYMBOLS, PINNED_SGLANG_VERSION, REQUIRED_HOOK_TARGETS


def test_installed_sglang_is_the_pinned_release() -> None:
    assert version("sglang") == PINNED_SGLANG_VERSION


@pytest.mark.parametrize("symbol", HOOKED_SYMBOLS, ids=[s.path for s in HOOKED_SYMBOLS])
def test_hooked_symbol_signature(symbol) -> None:  # type: ignore[no-untyped-def]
    obj = pkgutil.resolve_name(symbol.path)
    if inspect.isclass(obj) and "__dataclass_fields__" in vars(obj):
        names = set(obj.__dataclass_fields__)
    else:
        names = set(inspect.signature(obj).parameters)
    missing = [p for p in symbol.params if p not in names]
    assert not missing, f"{symbol.path} lost parameters {missing}; has {sorted(names)}"


@pytest.mark.parametrize("target", REQUIRED_HOOK_TARGETS)
def test_required_hook_targets_resolve(target: str) -> None:
    module, _, attr = target.rpartition(".")
    owner = pkgutil.resolve_name(module)
    assert callable(getattr(owner, attr))


def test_sgl_kernel_names_cover_what_sglang_imports_on_cpu() -> None:
    # Importing the modules that take names from sgl_kernel at import time on
    # CPU fails with ImportError if the stub lacks one.
    import sglang.kernels.ops.speculative.cache_locs
    import sglang.srt.managers.scheduler
    import sglang.srt.mem_cache.allocation
    import sglang.srt.model_executor.model_runner  # noqa: F401
