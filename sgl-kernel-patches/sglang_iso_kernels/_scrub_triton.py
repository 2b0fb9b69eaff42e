"""Triton kernels for :func:`sglang_iso_kernels.scrub.scrub_pages` (imported only when Triton runs).

One launch zeroes the listed pages of every buffer in a group (same words per page), with one of two layouts:

rows (pages of at least ``_ROWS_MIN_WORDS`` words, the usual case on a GPU: a 16-token page of 8 heads x 128
fp16 is 8,192 words): program ``(i, j)`` takes listed pages ``i, i + G0, ...`` and buffers ``j, j + G1, ...``;
page and buffer are scalars, so each store is one contiguous block of up to ``_ROW_BLOCK_MAX`` words with no
per-word index arithmetic::

    store 0 at  (word*) addrs[buf] + page_ids[p] * page_words + [w0, w0 + BLOCK)

flat (small pages, where a row-sized block would leave most lanes idle): the work is a flat range of words,
``total = num_buffers * num_pages * page_words``::

    flat word i  ->  buf = i // (num_pages * page_words)      which buffer (its address is addrs[buf])
                     p   = (i // page_words) % num_pages      which listed page (page_ids[p])
                     w   = i % page_words                     word inside that page's contiguous span
    store 0 at  (word*) addrs[buf] + page_ids[p] * page_words + w

Both grids are bounded (``_MAX_PROGRAMS``, ``_ROW_MAX_PROGRAMS``), each program striding over its share, so
the launch size is bounded whatever the number of pages, layers or heads (never pages x layers x heads).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

_BLOCK = 1024  # words per program iteration (flat layout)
_MAX_PROGRAMS = 1024  # upper bound on the grid; programs loop over the remaining work
_ROWS_MIN_WORDS = 1024  # pages of at least this many words use the rows layout
_ROW_BLOCK_MAX = 4096  # words per store in the rows layout (16 KiB of int32)
_ROW_BUFFER_PROGRAMS = 32  # rows layout: grid size along the buffers
# NOTE: the rows layout loads a page id and a buffer address before each run of stores, so it needs more
# programs in flight to hide that latency: on an H200, 4096 programs scrubbed 32 KiB pages at 1.35 TB/s,
# 1024 at 0.78 TB/s, 16384 no faster than 4096.
_ROW_MAX_PROGRAMS = 4096


@triton.jit
def _scrub_pages_kernel(
    addrs_ptr,  # [num_buffers] int64 base addresses
    page_ids_ptr,  # [num_pages] int64
    page_words,  # words per page in every buffer of this group
    words_per_buffer,  # num_pages * page_words
    total_words,  # num_buffers * num_pages * page_words
    WORD_BYTES: tl.constexpr,  # 4 -> int32 words, 1 -> bytes
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    num_blocks = tl.cdiv(total_words, BLOCK)
    # NOTE: offsets kept in int64 outside the loop because the loop variable is int32 on GPU (and a plain
    # Python int in the interpreter), and block * BLOCK can pass 2**31 words in a large pool.
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)  # [BLOCK] int64 flat word ids
    stride = num_programs.to(tl.int64) * BLOCK
    for _ in range(pid, num_blocks, num_programs):
        mask = offs < total_words
        buf = offs // words_per_buffer
        rem = offs - buf * words_per_buffer
        p = rem // page_words
        w = rem - p * page_words
        base = tl.load(addrs_ptr + buf, mask=mask, other=0)  # [BLOCK] int64 addresses
        page = tl.load(page_ids_ptr + p, mask=mask, other=0)  # [BLOCK] int64
        word_off = page * page_words + w
        if WORD_BYTES == 4:
            ptr = base.to(tl.pointer_type(tl.int32)) + word_off
            tl.store(ptr, tl.zeros([BLOCK], dtype=tl.int32), mask=mask)
        else:
            ptr = base.to(tl.pointer_type(tl.uint8)) + word_off
            tl.store(ptr, tl.zeros([BLOCK], dtype=tl.uint8), mask=mask)
        offs += stride


@triton.jit
def _scrub_rows_kernel(
    addrs_ptr,  # [num_buffers] int64 base addresses
    page_ids_ptr,  # [num_pages] int64
    num_buffers,
    num_pages,
    page_words,  # words per page in every buffer of this group
    WORD_BYTES: tl.constexpr,  # 4 -> int32 words, 1 -> bytes
    BLOCK: tl.constexpr,
):
    lanes = tl.arange(0, BLOCK)
    for p in range(tl.program_id(0), num_pages, tl.num_programs(0)):
        start = tl.load(page_ids_ptr + p) * page_words  # int64 word offset of the page in every buffer
        for b in range(tl.program_id(1), num_buffers, tl.num_programs(1)):
            base = tl.load(addrs_ptr + b)  # int64 address
            for w0 in range(0, page_words, BLOCK):
                offs = w0 + lanes
                mask = offs < page_words
                if WORD_BYTES == 4:
                    ptr = base.to(tl.pointer_type(tl.int32)) + start + offs
                    tl.store(ptr, tl.zeros([BLOCK], dtype=tl.int32), mask=mask)
                else:
                    ptr = base.to(tl.pointer_type(tl.uint8)) + start + offs
                    tl.store(ptr, tl.zeros([BLOCK], dtype=tl.uint8), mask=mask)


def scrub_pages_triton(
    buffers: Sequence[torch.Tensor], page_ids: torch.Tensor, page_words: int, word_bytes: int
) -> None:
    """Zero ``page_words`` words at ``page_ids[p] * page_words`` in each buffer, one launch. MUTATES buffers.

    Callers (``scrub_pages``) have validated range, contiguity and device, and chosen ``word_bytes`` (1 or 4)
    so that every base address and ``page_words * word_bytes`` are multiples of it.
    """
    assert word_bytes in (1, 4), f"{word_bytes=}"
    num_pages = page_ids.numel()
    total_words = len(buffers) * num_pages * page_words
    if total_words == 0:
        return
    addrs = torch.tensor([buf.data_ptr() for buf in buffers], dtype=torch.int64).to(page_ids.device)  # [n]
    if page_words >= _ROWS_MIN_WORDS:
        grid_b = min(len(buffers), _ROW_BUFFER_PROGRAMS)
        rows_grid = (min(num_pages, max(1, _ROW_MAX_PROGRAMS // grid_b)), grid_b)
        block = min(_ROW_BLOCK_MAX, triton.next_power_of_2(page_words))
        _scrub_rows_kernel[rows_grid](addrs, page_ids, len(buffers), num_pages, page_words, WORD_BYTES=word_bytes,
                                 BLOCK=block)  # fmt: skip
        return
    grid = (min(triton.cdiv(total_words, _BLOCK), _MAX_PROGRAMS),)
    _scrub_pages_kernel[grid](
        addrs, page_ids, page_words, num_pages * page_words, total_words, WORD_BYTES=word_bytes, BLOCK=_BLOCK
    )
