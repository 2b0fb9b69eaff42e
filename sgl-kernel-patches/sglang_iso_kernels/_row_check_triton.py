"""Triton kernel for :func:`sglang_iso_kernels.row_check.sanitize_rows` (imported only when Triton runs).

One program per request, looping over its row window in blocks. Pages of the tokens this step writes are
adopted with an atomic max (same rule as the torch version), refused slots are stored back with a masked
store (kept slots are never written), and the refused count is added once per request.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 512  # tokens per loop iteration


@triton.jit
def _sanitize_rows_kernel(
    req_to_token_ptr,  # [R, L] int32, refused slots rewritten
    req_pool_indices_ptr,  # [B]
    seq_lens_ptr,  # [B]
    write_start_ptr,  # [B]
    page_owner_ptr,  # [P] int32, -1 = FREE; adopted pages written
    row_owner_ptr,  # [R] int32, -1 = untracked
    allowed_ptr,  # [S, K] int32, -1 padded
    violations_ptr,  # [B] int32 out
    req_to_token_stride,
    allowed_stride,
    num_allowed,
    num_pages,
    page_size,
    zero_base,  # zero_page * page_size
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    me = tl.load(row_owner_ptr + row)
    if me >= 0:
        num_tokens = tl.load(seq_lens_ptr + b).to(tl.int64)
        start_new = tl.load(write_start_ptr + b).to(tl.int64)
        base = row * req_to_token_stride
        refused_count = tl.zeros([BLOCK], dtype=tl.int32)
        offs = tl.arange(0, BLOCK).to(tl.int64)
        for _ in range(0, tl.cdiv(num_tokens, BLOCK)):
            mask = offs < num_tokens
            slot = tl.load(req_to_token_ptr + base + offs, mask=mask, other=0).to(tl.int64)
            page = slot // page_size
            in_range = mask & (slot >= 0) & (page < num_pages)
            current = tl.load(page_owner_ptr + page, mask=in_range, other=-1)
            adopt = in_range & (offs >= start_new) & ((current == -1) | (current == me))
            old = tl.atomic_max(page_owner_ptr + page, tl.zeros_like(current) + me, mask=adopt)
            owner = tl.where(adopt, tl.maximum(old, me), current)
            ok = (owner >= 0) & (owner == me)
            for k in range(0, num_allowed):
                extra = tl.load(allowed_ptr + me.to(tl.int64) * allowed_stride + k)
                ok = ok | ((owner >= 0) & (extra >= 0) & (owner == extra))
            refused = mask & (ok == 0)
            offset_in_page = tl.where(slot >= 0, slot % page_size, 0)
            tl.store(req_to_token_ptr + base + offs, (zero_base + offset_in_page).to(tl.int32), mask=refused)
            refused_count += tl.where(refused, 1, 0).to(tl.int32)
            offs += BLOCK
        tl.atomic_add(violations_ptr + b, tl.sum(refused_count, axis=0))


def sanitize_rows_triton(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    write_start: torch.Tensor,
    page_owner: torch.Tensor,
    row_owner: torch.Tensor,
    allowed: torch.Tensor,
    page_size: int,
    zero_page: int,
    violations: torch.Tensor,
) -> None:
    """Launch on validated inputs (see ``sanitize_rows``). MUTATES ``req_to_token``, ``page_owner``,
    ``violations``."""
    batch = req_pool_indices.numel()
    assert batch > 0, f"{batch=}"
    allowed = allowed.contiguous()
    _sanitize_rows_kernel[(batch,)](
        req_to_token,
        req_pool_indices,
        seq_lens,
        write_start,
        page_owner,
        row_owner,
        allowed,
        violations,
        req_to_token.stride(0),
        allowed.stride(0),
        allowed.shape[1],
        page_owner.numel(),
        page_size,
        zero_page * page_size,
        BLOCK=_BLOCK,
    )
