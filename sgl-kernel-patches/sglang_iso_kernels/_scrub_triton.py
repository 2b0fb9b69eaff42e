"""Triton kernel for :func:`sglang_iso_kernels.scrub.scrub_pages` (imported only when Triton runs).

One launch zeroes the listed pages of every buffer in a group (same words per page). The work is a flat
range of words, ``total = num_buffers * num_pages * page_words``::

    flat word i  ->  buf = i // (num_pages * page_words)      which buffer (its address is addrs[buf])
                     p   = (i // page_words) % num_pages      which listed page (page_ids[p])
                     w   = i % page_words                     word inside that page's contiguous span
    store 0 at  (word*) addrs[buf] + page_ids[p] * page_words + w

The grid is ``min(cdiv(total, BLOCK), MAX_PROGRAMS)`` programs, each striding over blocks, so the launch
size is bounded whatever the number of pages, layers or heads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

_BLOCK = 1024  # words per program iteration
_MAX_PROGRAMS = 1024  # upper bound on the grid; programs loop over the remaining blocks


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
    grid = (min(triton.cdiv(total_words, _BLOCK), _MAX_PROGRAMS),)
    _scrub_pages_kernel[grid](
        addrs, page_ids, page_words, num_pages * page_words, total_words, WORD_BYTES=word_bytes, BLOCK=_BLOCK
    )
