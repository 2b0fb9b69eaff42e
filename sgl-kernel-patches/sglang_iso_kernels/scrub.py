"""Zero freed KV pages in every layer's buffers.

A page freed by one tenant must not leak its K/V into the next tenant that gets it, so the pool scrubs it
before reuse. Scrubbing is byte-level: all-zero bits are 0 in every float, int and fp8 dtype, so one kernel
serves K, V and scale buffers alike.

Slot layout (slot-major, the layout of SGLang's ``MHATokenToKVPool`` buffers)::

    buffer [num_slots, *row_shape]      page p owns rows  p*page_size .. p*page_size + page_size - 1
           |<- row_bytes ->|            so its bytes are  [p*page_bytes, (p+1)*page_bytes),
                                        page_bytes = page_size * row_bytes (one contiguous span)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sglang_iso_kernels._backend import resolve_use_triton

# NOTE: words of 4 bytes when every base pointer and the row size allow it, else single bytes, because a
# misaligned int32 store is undefined on GPU while 4-byte stores move 4x the data per instruction.
_WORD_BYTES_WIDE = 4


def scrub_pages(
    buffers: Sequence[torch.Tensor],
    page_ids: torch.Tensor,
    page_size: int,
    *,
    use_triton: bool | None = None,
) -> None:
    """Zero every row of the listed pages in every buffer, in place.

    Args:
        buffers: every layer's K and V buffers (and any scale buffers), each ``[num_slots, *row_shape]``,
            contiguous, any dtype, all on ``page_ids``'s device. Buffers may differ in dtype, row shape and
            ``num_slots``. MUTATED: rows ``p*page_size .. p*page_size + page_size - 1`` become all-zero bytes
            for each ``p`` in ``page_ids``; no other byte changes.
        page_ids: ``[num_pages]`` int64 page ids (units: pages). Duplicates are harmless (zeroing twice).
        page_size: tokens (slots) per page, >= 1.
        use_triton: True forces the Triton kernel (one launch per row-size group, addresses passed as an
            int64 tensor; on CPU under ``TRITON_INTERPRET=1``), False forces torch ``index_fill_``; None picks
            Triton on CUDA and torch on CPU.

    Raises:
        ValueError: a buffer is not a contiguous tensor on ``page_ids``'s device, ``page_ids`` is not 1-D
            int64, ``page_size < 1``, or a page id is negative or past the end of some buffer.
    """
    device = _validate(buffers, page_ids, page_size)
    if page_ids.numel() == 0 or len(buffers) == 0:
        return
    live = [buf for buf in buffers if buf.numel() > 0]
    if resolve_use_triton(use_triton, device):
        from sglang_iso_kernels._scrub_triton import scrub_pages_triton

        for word_bytes, page_words, group in _group_by_row(live, page_size):
            scrub_pages_triton(group, page_ids, page_words, word_bytes)
    elif device.type == "cpu":
        # NOTE: numpy stores into byte views of the same memory: single-threaded, where torch's index_fill_ opens
        # a thread-parallel region past 32k elements, which costs milliseconds on a host whose cores are busy
        # with the forward (about 1 ms per freed request's pages in a 2-core server, against 6 us here).
        _zero_host_rows([_byte_rows(buf).numpy() for buf in live], _sorted_distinct(page_ids.numpy()), page_size)
    else:
        rows = _page_rows(page_ids, page_size)  # [num_pages * page_size] int64
        for buf in live:
            _fill_rows(buf).index_fill_(0, rows, 0)


class HostScrubber:
    """:func:`scrub_pages` for a fixed set of host buffers, checked and viewed as byte rows once.

    A scheduler zeroes the same pool's buffers before every hand-out; :func:`scrub_pages` re-validates each buffer
    and makes its views on every call, about 20 us for four buffers whatever the page count, where the zeroing of
    a request's pages takes a few. Here each call checks only its page ids (numpy, no torch op) and, where they form
    a few contiguous runs (pages freed together, as a tree node's are), zeroes each run as one slice per buffer.
    """

    MAX_RUNS = 4
    """Runs of consecutive pages zeroed as slices; more are zeroed by fancy indexing, one store per buffer."""

    def __init__(self, buffers: Sequence[torch.Tensor], page_size: int) -> None:
        """Raises:
        ValueError: as :func:`scrub_pages` for these buffers, or a buffer is not on the host.
        """
        _validate(buffers, torch.empty(0, dtype=torch.int64), page_size)  # (every buffer on the host, contiguous)
        self.page_size = page_size
        self.buffers = [buf for buf in buffers if buf.numel() > 0]
        self.pages_limit = min((buf.shape[0] for buf in buffers), default=0) // page_size
        """Page ids must lie below this: the smallest buffer's whole pages."""
        self._views: list[np.ndarray] = []
        self._ptrs: list[int] = []
        self._view()

    def _view(self) -> None:
        self._views = [_byte_rows(buf).numpy() for buf in self.buffers]  # [num_slots, row_bytes] uint8 each
        self._ptrs = [buf.data_ptr() for buf in self.buffers]

    def zero(self, pages: np.ndarray) -> int:
        """Zero every row of ``pages`` (1-D int64 page ids, any order, duplicates harmless) in every buffer, in
        place; the number of distinct pages zeroed.

        Raises:
            ValueError: ``pages`` is not 1-D int64, or a page id is negative or past the smallest buffer's pages.
        """
        if not isinstance(pages, np.ndarray) or pages.ndim != 1 or pages.dtype != np.int64:
            raise ValueError("pages must be a 1-D int64 array")
        if pages.size == 0:
            return 0
        unique = _sorted_distinct(pages)
        lo, hi = int(unique[0]), int(unique[-1])
        if lo < 0 or hi >= self.pages_limit:
            raise ValueError(f"page ids must lie in [0, {self.pages_limit}) for page_size={self.page_size}, "
                             f"got min={lo} max={hi}")  # fmt: skip
        if [buf.data_ptr() for buf in self.buffers] != self._ptrs:
            self._view()  # NOTE: a buffer's storage was replaced: view the memory it holds now
        _zero_host_rows(self._views, unique, self.page_size, self.MAX_RUNS)
        return int(unique.size)


def _sorted_distinct(ids: np.ndarray) -> np.ndarray:
    """``ids`` (1-D) sorted, each once: ``np.unique``'s answer.

    NOTE: a sort and a neighbour comparison; ``np.unique`` itself took 90-215 us for a freed node's ~600 page ids
    inside a serving scheduler (thread CPU; the most on ids already sorted, the usual case), this 15-20 us.
    """
    ordered = np.sort(ids)
    if ordered.size < 2:
        return ordered
    first = np.empty(ordered.size, dtype=bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def _zero_host_rows(views: list[np.ndarray], unique: np.ndarray, page_size: int, max_runs: int = 4) -> None:
    """Zero the rows of pages ``unique`` (sorted, distinct, in range) in each ``[num_slots, row_bytes]`` byte view:
    up to ``max_runs`` runs of consecutive pages as one slice each, more by fancy indexing (one store per view;
    numpy, for the reason :func:`scrub_pages` gives)."""
    if unique.size == 0:
        return
    first, last = int(unique[0]), int(unique[-1])
    if max_runs >= 1 and last - first + 1 == unique.size:
        # NOTE: one run (the usual hand-out: a freed node's pages), found without the run search below, whose array
        # operations cost several microseconds each in a scheduler between two forwards.
        firsts, lasts = [first], [last]
    else:
        breaks = np.flatnonzero(np.diff(unique) != 1) + 1
        if breaks.size >= max_runs:
            rows = unique if page_size == 1 else (unique[:, None] * page_size + np.arange(page_size)).reshape(-1)
            for view in views:
                view[rows] = 0
            return
        firsts = unique[np.concatenate(([0], breaks))].tolist()
        lasts = unique[np.concatenate((breaks - 1, [unique.size - 1]))].tolist()
    for view in views:
        for run_first, run_last in zip(firsts, lasts, strict=True):
            view[run_first * page_size : (run_last + 1) * page_size] = 0


# ---------------------------------------------------------------------------------------------------------
# private helpers


def _validate(buffers: Sequence[torch.Tensor], page_ids: torch.Tensor, page_size: int) -> torch.device:
    if not isinstance(page_ids, torch.Tensor) or page_ids.dim() != 1 or page_ids.dtype != torch.int64:
        raise ValueError("page_ids must be a 1-D int64 tensor")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    for i, buf in enumerate(buffers):
        if not isinstance(buf, torch.Tensor) or buf.dim() < 1:
            raise ValueError(f"buffers[{i}] must be a tensor shaped [num_slots, ...]")
        if not buf.is_contiguous():
            raise ValueError(f"buffers[{i}] must be contiguous (shape {tuple(buf.shape)}, stride {buf.stride()})")
        if buf.device != page_ids.device:
            raise ValueError(f"buffers[{i}] is on {buf.device} but page_ids is on {page_ids.device}")
    if page_ids.numel() > 0 and len(buffers) > 0:
        # NOTE: a host sync, kept because an out-of-range id would make the Triton kernel write outside the
        # pool (a security bug, so never an assert).
        if page_ids.device.type == "cpu":
            lo, hi = int(page_ids.numpy().min()), int(page_ids.numpy().max())
        else:
            lo, hi = (int(x) for x in torch.aminmax(page_ids))
        min_slots = min(buf.shape[0] for buf in buffers)
        if lo < 0 or (hi + 1) * page_size > min_slots:
            raise ValueError(
                f"page_ids must lie in [0, {min_slots // page_size}) for page_size={page_size} and the smallest "
                f"buffer's {min_slots} slots, got min={lo} max={hi}"
            )
    return page_ids.device


def _page_rows(page_ids: torch.Tensor, page_size: int) -> torch.Tensor:
    """``[num_pages * page_size]`` int64 slot rows covered by ``page_ids`` (page-major order)."""
    offsets = torch.arange(page_size, dtype=torch.int64, device=page_ids.device)  # [page_size]
    return (page_ids[:, None] * page_size + offsets[None, :]).reshape(-1)  # [num_pages * page_size]


# NOTE: dtypes whose zero value is all-zero bits and that index_fill_ handles natively; filling in the buffer's
# own dtype is ~15x faster on CPU than a uint8 view (measured in benchmark/scrub.py).
_NATIVE_FILL = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16)


def _fill_rows(buf: torch.Tensor) -> torch.Tensor:
    """``[num_slots, row_elems]`` view in the buffer's dtype when zero-filling it zeroes every byte, else bytes."""
    if buf.dtype in _NATIVE_FILL:
        return buf.view(buf.shape[0], -1)  # [num_slots, row_elems]
    return _byte_rows(buf)


def _byte_rows(buf: torch.Tensor) -> torch.Tensor:
    """View a contiguous ``[num_slots, ...]`` buffer as ``[num_slots, row_bytes]`` uint8 (shares storage)."""
    return buf.view(buf.shape[0], -1).view(torch.uint8)  # [num_slots, row_bytes]


def _group_by_row(buffers: Sequence[torch.Tensor], page_size: int) -> list[tuple[int, int, list[torch.Tensor]]]:
    """Group buffers by (word size, words per page); one Triton launch serves each group.

    Returns ``(word_bytes, page_words, buffers)`` triples in first-seen order.
    """
    groups: dict[tuple[int, int], list[torch.Tensor]] = {}
    for buf in buffers:
        row_bytes = buf[0].numel() * buf.element_size()
        wide = row_bytes % _WORD_BYTES_WIDE == 0 and buf.data_ptr() % _WORD_BYTES_WIDE == 0
        word_bytes = _WORD_BYTES_WIDE if wide else 1
        page_words = page_size * row_bytes // word_bytes
        groups.setdefault((word_bytes, page_words), []).append(buf)
    return [(word_bytes, page_words, group) for (word_bytes, page_words), group in groups.items()]
