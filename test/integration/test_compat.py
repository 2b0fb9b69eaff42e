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


def test_standalone_worker_inherits_the_checked_entry_and_sets_the_step_width() -> None:
    # spec_draft hooks EAGLEWorkerV2.forward_batch_generation: STANDALONE must not override it, and the
    # step width reads attributes its __init__ sets.
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
    from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2

    assert issubclass(StandaloneWorkerV2, EAGLEWorkerV2)
    assert "forward_batch_generation" not in vars(StandaloneWorkerV2)
    source = inspect.getsource(StandaloneWorkerV2.__init__)
    for attr in ("speculative_num_steps", "topk", "speculative_num_draft_tokens", "adaptive_controller"):
        assert f"self.{attr} =" in source or f"self.{attr}:" in source, attr
