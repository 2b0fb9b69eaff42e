"""Kernels that keep SGLang's KV pool safe to share across tenants.

* :mod:`.scrub` -- zero freed KV pages in every layer's buffers (one Triton launch per row-size group).
* :mod:`.row_check` -- sanitize a whole batch's ``req_to_token`` row windows in place before the forward
  (adopt this step's pages, redirect foreign or free slots to the zero page), for every attention backend.
* :mod:`.verified_rows` -- on CPU, decide a decode step from what was verified of each row (its new column only).

Everything works on CPU: without CUDA the torch paths run, and under ``TRITON_INTERPRET=1`` the Triton
kernels run in Triton's interpreter (slow; for tests).
"""

from __future__ import annotations

from sglang_iso_kernels.row_check import clean_rows_host, sanitize_rows
from sglang_iso_kernels.scrub import HostScrubber, scrub_pages

__all__ = [
    "HostScrubber",
    "clean_rows_host",
    "sanitize_rows",
    "scrub_pages",
]
