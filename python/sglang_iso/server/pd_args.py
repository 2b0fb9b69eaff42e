"""The SGLang defaults a prefill/decode (PD) worker gets from the launcher.

What PD setups are covered (``--disaggregation-mode prefill`` and ``decode`` over ``mooncake`` or
``mooncake_tcp``) and which are refused by name is in the coverage table, :mod:`sglang_iso.coverage`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_iso.server.argv import flag_value, has_flag


def pd_defaults(argv: Sequence[str], *, cuda_available: bool) -> list[str]:
    """Flags a PD worker gets unless set.

    * decode: retracted requests' KV goes to per-request CPU tensors (NOTE: SGLang would pick ``host_pool``,
      which needs its own tree cache, refused above);
    * prefill without CUDA: no overlap scheduler (NOTE: its early send of a cached prefix records a CUDA
      event on the forward stream, which stops a CPU scheduler).
    """
    mode = flag_value(argv, "--disaggregation-mode")
    if mode == "decode" and not has_flag(argv, "--disaggregation-decode-retraction-backup"):
        return ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
    if mode == "prefill" and not cuda_available and not has_flag(argv, "--disable-overlap-schedule"):
        return ["--disable-overlap-schedule"]
    return []
