"""CPU compatibility for the pinned SGLang wheel, applied in every process.

SGLang's CPU path expects a CPU build of ``sgl_kernel`` (none is published) and
imports ``torchvision``, whose PyPI wheel is CUDA-linked and fails at import on
a CPU-only torch. This module fixes both without touching any installed file:

* ``torchvision``: the C extension cannot load, so the ``torchvision::nms`` and
  ``torchvision::qnms`` operators never get a schema and torchvision's own
  ``register_fake`` calls raise at import. We define those two schemas with a
  kernel that raises a clear error, so the import succeeds and any real call
  still fails loudly.
* ``sgl_kernel``: a stand-in module exposes exactly the names SGLang imports at
  module level on CPU. The speculative-decoding ops get torch versions
  (:mod:`sglang_iso.platform.spec_cpu`), as do the linear-attention convolution
  and gates (``sgl_kernel.mamba`` and one ``torch.ops.sgl_kernel`` op,
  :mod:`sglang_iso.platform.linear_attn_cpu`); every other one raises
  :class:`MissingKernelError` naming the op if it is ever called.
  ``torch.ops.sgl_kernel`` has no ``convert_weight_packed``, so
  ``cpu_has_amx_support()`` is False and layers use their ``forward_native`` paths.

It is active only on a machine without CUDA (or when ``SGLANG_ISO_FORCE_CPU=1``)
and is idempotent. It must run before the first ``import sglang.srt...`` in a
process: the launcher imports it at module level, which ``multiprocessing``'s
spawn start method re-executes in every child before it unpickles the target.
"""

from __future__ import annotations

import os
import sys
import types
from typing import NoReturn

from sglang_iso import envvars

# Names that sglang 0.5.23 imports from ``sgl_kernel`` at module level when
# SGLANG_USE_CPU_ENGINE=1. Keep in step with the pinned wheel; the
# compatibility test imports every module that needs them.
SGL_KERNEL_CPU_NAMES: tuple[str, ...] = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
)

_STUB_MODULE_NAME = "sgl_kernel"
_applied = False


class MissingKernelError(RuntimeError):
    """Raised when code calls a kernel that has no CPU build."""


def should_apply() -> bool:
    """True when this process runs SGLang without CUDA."""
    if envvars.FORCE_CPU.get() == "1":  # NOTE: read at interpreter start, before any settings
        return True
    try:
        import torch
    except ImportError:
        return False
    return not torch.cuda.is_available()


def apply() -> bool:
    """Install the CPU compatibility shims in this process.

    Returns:
        True if the shims are active (now or from an earlier call).
    """
    global _applied
    if _applied:
        return True
    if not should_apply():
        return False
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    _define_torchvision_op_schemas()
    _install_sgl_kernel_stub()
    _applied = True
    return True


def is_applied() -> bool:
    return _applied


def missing_kernel(op_name: str) -> types.FunctionType:
    def kernel(*_args: object, **_kwargs: object) -> NoReturn:
        raise MissingKernelError(
            f"{op_name} has no CPU build in this installation; sglang-iso supports "
            "CPU serving of dense decoder models (speculative decoding: NGRAM only)."
        )

    kernel.__name__ = op_name.rsplit(".", 1)[-1]
    kernel.__qualname__ = kernel.__name__
    return kernel  # type: ignore[return-value]


def _install_sgl_kernel_stub() -> None:
    if _STUB_MODULE_NAME in sys.modules:
        return
    try:
        import importlib.util

        if importlib.util.find_spec(_STUB_MODULE_NAME) is not None:
            return  # a real build is installed: never shadow it
    except (ImportError, ValueError):
        pass
    stub = types.ModuleType(_STUB_MODULE_NAME)
    stub.__doc__ = "sglang-iso stand-in: torch versions of the speculative ops; the rest raise MissingKernelError."
    stub.__dict__["__sglang_iso_stub__"] = True
    for name in SGL_KERNEL_CPU_NAMES:
        setattr(stub, name, missing_kernel(f"sgl_kernel.{name}"))
    from sglang_iso.platform import spec_cpu

    spec_cpu.install(stub)  # torch versions of the speculative-decoding ops (EAGLE's tree builder excepted)
    from sglang_iso.platform import linear_attn_cpu

    linear_attn_cpu.install(stub)  # linear-attention convolution and gates (sgl_kernel.mamba)
    sys.modules[_STUB_MODULE_NAME] = stub


_TORCHVISION_SCHEMAS: dict[str, str] = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_torchvision_lib: object | None = None


def _define_torchvision_op_schemas() -> None:
    global _torchvision_lib
    import torch

    missing = [n for n in _TORCHVISION_SCHEMAS if not _has_torch_op("torchvision", n)]
    if not missing:
        return
    # NOTE: the Library object must stay alive or its definitions are dropped.
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name in missing:
        lib.define(_TORCHVISION_SCHEMAS[name])
        lib.impl(name, missing_kernel(f"torchvision::{name}"), "CompositeExplicitAutograd")
    _torchvision_lib = lib


def _has_torch_op(namespace: str, name: str) -> bool:
    import torch

    try:
        torch._C._dispatch_find_schema_or_throw(f"{namespace}::{name}", "")
    except RuntimeError:
        return False
    return True
