"""CPU compatibility for prefill/decode transfers over Mooncake's TCP transport.

On a machine without CUDA (:func:`cpu.should_apply`), ``MooncakeKVSender``
declares ``supports_host_tensor_indices = False``: with it True, the prefill
scheduler copies page indices into pinned memory and records a CUDA event
(``disaggregation/prefill.py`` ``_send_kv_chunk``), which a CPU-only torch cannot
do and which stopped the prefill scheduler. False selects SGLang's plain
host-side index path. Applied when the module is imported; nothing on disk changes.
"""

from __future__ import annotations

import types

from sglang_iso.platform.import_patch import ShimOnImport

MOONCAKE_CONN_MODULE = "sglang.srt.disaggregation.mooncake.conn"


def apply() -> bool:
    """Install the shim (now, or when the Mooncake module is imported). Idempotent; False with CUDA."""
    return _SHIM.apply()


def patch_module(module: types.ModuleType) -> None:
    sender = getattr(module, "MooncakeKVSender", None)
    if sender is not None:
        sender.supports_host_tensor_indices = False


_SHIM = ShimOnImport([MOONCAKE_CONN_MODULE], patch_module)
