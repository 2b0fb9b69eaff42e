"""Scrub-on-free: freed KV pages are zeroed before anyone can be handed them again.

Installed on the allocator instance the tenant cache receives (not only on tree
eviction), through its :mod:`~sglang_iso.integration.allocator_tap`, so all free
paths are covered: tree eviction, duplicate slots after insert, request release
and tenant flush all end in the allocator's release.

    allocator release (page 1: ``free``; paged: ``_release_page_ids``)
        -> page ids recorded as pending, then released as upstream does
    allocator hand-out (``alloc``, ``alloc_extend``, ``alloc_decode``)
        -> every pending page is zeroed in one batched call first

Batching at hand-out gives one scrub per scheduler step however many frees it
made, and guarantees the order "scrubbed before allocated again". On CUDA the
scrub first waits for the forward stream, so no kernel still reading a freed
page races with its zeroing (overlap scheduler). Freed request rows of
``req_to_token`` are reset to the padding slot at once.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang_iso.coverage import NotCoveredError
from sglang_iso.integration import allocator_tap
from sglang_iso.integration.allocator_tap import Order

logger = logging.getLogger(__name__)

_BUFFER_ATTRS = ("k_buffer", "v_buffer", "k_scale_buffer", "v_scale_buffer", "kv_buffer", "kv_scale_buffer")
_METADATA_ATTRS = frozenset({"data_ptrs", "k_data_ptrs", "v_data_ptrs", "data_strides"})
"""Per-layer addresses and strides of the buffers above: no tenant data."""
_ALLOC_METHODS = ("alloc", "alloc_extend", "alloc_decode")


class KvScrubber:
    """Zeroes freed pages of one allocator's KV pool. Single-threaded (scheduler thread)."""

    def __init__(self, allocator: Any, req_to_token_pool: Any, forward_stream: Any = None) -> None:
        """Raises:
        NotCoveredError: the pool has none of the known buffer attributes.
        """
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.page_size = int(allocator.page_size)
        self.forward_stream = forward_stream
        self.buffers = kv_buffers(allocator.get_kvcache())
        if not self.buffers:
            raise NotCoveredError(f"no KV buffers found on {type(allocator.get_kvcache()).__name__}")
        self.pending: list[torch.Tensor] = []  # page ids released but not yet zeroed
        self.scrubbed_pages = 0  # pages zeroed so far (a page freed twice between hand-outs counts twice)
        self.scrub_calls = 0
        self.reset_rows = 0
        self.draft_buffers = 0  # how many of ``buffers`` belong to a draft model's pool

    def install(self) -> KvScrubber:
        """Subscribe to the allocator's release and hand-out and the request pool's row release
        (:mod:`~sglang_iso.integration.allocator_tap`, innermost: it sees what the other layers release)."""
        alloc = self.allocator
        paged = allocator_tap.is_paged(alloc)
        tap = allocator_tap.tap_of(alloc)
        tap.subscribe(allocator_tap.RELEASE, Order.SCRUB, self._release_paged if paged else self._free)
        for name in _ALLOC_METHODS:
            if hasattr(alloc, name):
                tap.subscribe(name, Order.SCRUB, self._flush_before)
        pool = self.req_to_token_pool
        if pool is not None and hasattr(pool, "free_rows"):
            allocator_tap.tap_of(pool).subscribe("free_rows", Order.SCRUB, self._reset_rows)
        logger.info(
            "sglang-iso: scrub-on-free installed on %s.%s (%d buffers, page size %d)",
            type(alloc).__name__,
            allocator_tap.allocator_release_name(alloc),
            len(self.buffers),
            self.page_size,
        )
        return self

    def add_buffers(self, buffers: list[torch.Tensor]) -> None:
        """Zero these buffers too on every scrub: a draft model's KV pool, which indexes the same slots
        through the same allocator (``integration/spec_draft.py``)."""
        self.buffers = [*self.buffers, *buffers]
        self.draft_buffers += len(buffers)

    def flush(self) -> int:
        """Zero every pending page now; returns the number of pages zeroed."""
        if not self.pending:
            return 0
        pages = torch.cat(self.pending).to(torch.int64)
        self.pending = []
        pages = torch.unique(pages)
        if pages.is_cuda and self.forward_stream is not None:
            # NOTE: a forward still reading these pages must finish before they are zeroed.
            torch.cuda.current_stream().wait_stream(self.forward_stream)
        from sglang_iso_kernels import scrub_pages

        scrub_pages(self.buffers, pages, self.page_size)
        self.scrubbed_pages += int(pages.numel())
        self.scrub_calls += 1
        return int(pages.numel())

    def status(self) -> dict[str, int]:
        return {
            "scrubbed_pages": self.scrubbed_pages,
            "scrub_calls": self.scrub_calls,
            "pending_pages": sum(int(p.numel()) for p in self.pending),
            "reset_rows": self.reset_rows,
            "draft_buffers": self.draft_buffers,
        }

    # ------------------------------------------------------------------ tap layers
    def _free(self, below: Any, free_index: torch.Tensor) -> None:
        if free_index.numel() and self.allocator.free_group is None:
            self.pending.append(free_index.detach().clone())
        below(free_index)

    def _release_paged(self, below: Any, *page_ids: torch.Tensor) -> None:
        self.pending.extend(p.detach().clone() for p in page_ids if p.numel())
        below(*page_ids)

    def _flush_before(self, below: Any, *args: Any, **kwargs: Any) -> Any:
        self.flush()
        return below(*args, **kwargs)

    def _reset_rows(self, below: Any, indices: Any) -> None:
        rows = [int(i) for i in indices]
        if rows:
            # Slot 0 is the padding sink: a reset row points nowhere real.
            self.req_to_token_pool.req_to_token[rows] = 0
            self.reset_rows += len(rows)
        below(indices)


def kv_buffers(kvcache: Any) -> list[torch.Tensor]:
    """Every per-layer K, V, scale and MLA buffer of a KV pool, as ``[slots, ...]`` tensors."""
    out: list[torch.Tensor] = []
    for attr in _BUFFER_ATTRS:
        value = getattr(kvcache, attr, None)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, list | tuple):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def uncovered_tensors(kvcache: Any) -> frozenset[str]:
    """``Class.attribute`` of every tensor a KV pool holds that scrub-on-free does not zero.

    Everything but the buffers :func:`kv_buffers` returns and their address tables counts, in the pool and
    one level into SGLang objects it holds (an index-key cache, a compress tail), so a pool that gains a
    tensor in a new SGLang version is refused at start instead of keeping tenant data past a free.
    """
    name = type(kvcache).__name__
    return frozenset(
        f"{name}.{attr}"
        for attr, value in vars(kvcache).items()
        if attr not in _BUFFER_ATTRS and attr not in _METADATA_ATTRS and _holds_tensor(value, nested=True)
    )


def _holds_tensor(value: Any, *, nested: bool) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, list | tuple):
        return any(_holds_tensor(v, nested=nested) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v, nested=nested) for v in value.values())
    if nested and type(value).__module__.startswith("sglang.") and hasattr(value, "__dict__"):
        return any(_holds_tensor(v, nested=False) for v in vars(value).values())
    return False
