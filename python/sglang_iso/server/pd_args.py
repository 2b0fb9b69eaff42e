"""Which prefill/decode (PD) disaggregation setups sglang-iso serves, and which it refuses by name.

Covered (transfer quarantine and tenant tag, ``integration/pd_transfer.py``):

* ``--disaggregation-mode prefill`` and ``decode`` with ``--disaggregation-transfer-backend
  mooncake`` or ``mooncake_tcp`` (Mooncake's drain signals are read on both sides).

Refused: other transfer backends (their drain signals are not reviewed; ``fake`` moves no KV, so a decode
worker would compute from pages no prefill wrote), and PD features that move
or keep KV outside the quarantined device pages (decode radix cache, host staging and offload,
role switching, the staging buffer, a speculative draft model).
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_iso.server.argv import flag_value, has_flag
from sglang_iso.server.speculative import has_draft_model

COVERED_BACKENDS: dict[str, tuple[str, ...]] = {
    "prefill": ("mooncake", "mooncake_tcp"),
    "decode": ("mooncake", "mooncake_tcp"),
}
# PD flags whose KV lives outside the quarantined device pages: flag -> why.
UNCOVERED_PD_FLAGS: dict[str, str] = {
    "--disaggregation-decode-enable-radix-cache": "a decode radix cache keeps transferred pages in a shared tree",
    "--disaggregation-decode-enable-offload-kvcache": "decode KV offload copies transferred pages off the device",
    "--enable-pd-role-switch": "role switching rebuilds transfer state the quarantine tracks",
}


def refuse_uncovered_pd(argv: Sequence[str]) -> None:
    """Raises:
    ValueError: a PD setup sglang-iso does not cover, naming the flag.
    """
    mode = flag_value(argv, "--disaggregation-mode")
    if mode in (None, "null"):
        return
    if mode not in COVERED_BACKENDS:
        raise ValueError(f"--disaggregation-mode {mode} is not supported by sglang-iso (covered: prefill, decode)")
    backend = flag_value(argv, "--disaggregation-transfer-backend") or "mooncake"
    if backend not in COVERED_BACKENDS[mode]:
        raise ValueError(
            f"--disaggregation-transfer-backend {backend} is not supported by sglang-iso with --disaggregation-mode "
            f"{mode}: its drain signals are not covered by the transfer quarantine "
            f"(covered: {', '.join(COVERED_BACKENDS[mode])})"
        )
    for flag, why in UNCOVERED_PD_FLAGS.items():
        if has_flag(argv, flag):
            raise ValueError(f"{flag} is not supported by sglang-iso: {why}")
    algorithm = flag_value(argv, "--speculative-algorithm")
    if has_draft_model(algorithm):
        raise ValueError(
            f"--speculative-algorithm {algorithm} is not supported by sglang-iso with --disaggregation-mode {mode}: "
            "the draft model's KV and hidden states cross workers outside the transfer quarantine"
        )
    if flag_value(argv, "--disaggregation-decode-retraction-backup") == "host_pool":
        raise ValueError(
            "--disaggregation-decode-retraction-backup host_pool is not supported by sglang-iso: it needs SGLang's "
            "own tree cache (use cpu_tensor, the sglang-iso default, or none)"
        )
    threshold = flag_value(argv, "--disaggregation-decode-host-receive-threshold")
    if threshold is not None and threshold not in ("1", "1.0"):
        raise ValueError(
            "--disaggregation-decode-host-receive-threshold is not supported by sglang-iso: "
            "host-staged transfers land outside the quarantined device pages"
        )


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
