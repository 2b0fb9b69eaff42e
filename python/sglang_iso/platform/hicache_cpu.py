"""CPU compatibility for SGLang's own hierarchical cache (the upstream baseline; the tenant cache has its own tiers).

Upstream HiCache (``UnifiedRadixCache`` + ``HiCacheController``) serves on CPU
with ``--hicache-io-backend direct --hicache-mem-layout layer_first`` once two
things are shimmed, only on a machine without CUDA (:func:`cpu.should_apply`):

* the MHA host pool is built with ``pin_memory=False`` (a CPU-only torch has no
  pinned allocator);
* ``transfer_kv_direct``, which ``pool_host/mha.py`` imports from
  ``sgl_kernel.kvcacheio`` on CUDA/HIP/XPU only, gets a torch path
  (``index_select`` + ``index_copy_`` per layer buffer).

Applied when ``sglang.srt.mem_cache.pool_host.mha`` is imported (a
``sys.meta_path`` finder), so applying costs no import time; nothing on disk
changes. sglang-iso's benchmark uses it to run upstream HiCache side by side.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Sequence
from typing import Any

from sglang_iso.platform.import_patch import ShimOnImport

logger = logging.getLogger(__name__)

HOST_POOL_MODULE = "sglang.srt.mem_cache.pool_host.mha"


def apply() -> bool:
    """Install the shims (now, or when the host pool module is imported). Idempotent; False with CUDA."""
    return _SHIM.apply()


def transfer_kv_direct(
    src_layers: Sequence[Any], dst_layers: Sequence[Any], src_indices: Any, dst_indices: Any, page_size: int
) -> None:
    """``dst[dst_indices] = src[src_indices]`` for each (src, dst) buffer pair; indices are token slots."""
    del page_size  # token indices already cover whole pages
    for src, dst in zip(src_layers, dst_layers, strict=True):
        rows = src.index_select(0, src_indices.to(src.device))
        dst.index_copy_(0, dst_indices.to(dst.device), rows.to(dst.device))


def patch_module(module: types.ModuleType) -> None:
    """Give ``pool_host/mha.py`` the torch transfer and unpinned host pools (no-op if already done)."""
    if not hasattr(module, "transfer_kv_direct"):
        module.transfer_kv_direct = transfer_kv_direct  # type: ignore[attr-defined]
    pool = getattr(module, "MHATokenToKVPoolHost", None)
    if pool is None or getattr(pool.__init__, "__sglang_iso_unpinned__", False):
        return
    original = pool.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["pin_memory"] = False  # NOTE: no pinned allocator without CUDA
        original(self, *args, **kwargs)

    __init__.__sglang_iso_unpinned__ = True  # type: ignore[attr-defined]
    pool.__init__ = __init__
    logger.debug("sglang-iso: HiCache host pool unpinned and given a torch transfer_kv_direct")


_SHIM = ShimOnImport([HOST_POOL_MODULE], patch_module)
