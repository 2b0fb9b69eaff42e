"""Triton kernel for :func:`sglang_iso_kernels.kv_indices.build_kv_indices_checked` (imported only when
Triton runs). One program per request, looping over its tokens in blocks, like SGLang's
``create_flashinfer_kv_indices_triton``; the violation count is summed per block and added once per
request with an atomic."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 512  # tokens per loop iteration


@triton.jit
def _checked_kv_indices_kernel(
    req_to_token_ptr,  # [R, L] int32
    req_pool_indices_ptr,  # [B]
    lens_ptr,  # [B]
    kv_indptr_ptr,  # [B+1]
    kv_start_idx_ptr,  # [B] (unused unless HAS_START)
    page_owner_ptr,  # [num_pages] int32, -1 = FREE
    req_owner_ptr,  # [B] int32
    extra_ptr,  # [B, K] int32, -1 padded (unused unless HAS_EXTRA)
    kv_indices_ptr,  # [>= kv_indptr[B]] int32 out
    violations_ptr,  # [B] int32 out (atomic add)
    req_to_token_stride,
    extra_stride,
    num_extra,
    num_pages,
    page_size,
    zero_base,  # zero_page * page_size (first slot of the zero page)
    HAS_START: tl.constexpr,
    HAS_EXTRA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    row = tl.load(req_pool_indices_ptr + b).to(tl.int64)
    out_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    num_tokens = tl.load(lens_ptr + b).to(tl.int64)
    src_start = row * req_to_token_stride
    if HAS_START:
        src_start += tl.load(kv_start_idx_ptr + b).to(tl.int64)
    me = tl.load(req_owner_ptr + b)
    refused_count = tl.zeros([BLOCK], dtype=tl.int32)
    offs = tl.arange(0, BLOCK).to(tl.int64)  # [BLOCK] int64 token column
    for _ in range(0, tl.cdiv(num_tokens, BLOCK)):
        mask = offs < num_tokens
        slot = tl.load(req_to_token_ptr + src_start + offs, mask=mask, other=0).to(tl.int64)  # [BLOCK]
        page = slot // page_size
        in_range = (slot >= 0) & (page < num_pages)
        owner = tl.load(page_owner_ptr + page, mask=mask & in_range, other=-1)  # [BLOCK] int32
        ok = (owner >= 0) & (owner == me)
        if HAS_EXTRA:
            for k in range(0, num_extra):
                extra = tl.load(extra_ptr + b * extra_stride + k)
                ok = ok | ((owner >= 0) & (extra >= 0) & (owner == extra))
        offset_in_page = tl.where(slot >= 0, slot % page_size, 0)
        out = tl.where(ok, slot, zero_base + offset_in_page)
        tl.store(kv_indices_ptr + out_start + offs, out.to(tl.int32), mask=mask)
        refused_count += tl.where(mask & (ok == 0), 1, 0).to(tl.int32)
        offs += BLOCK
    tl.atomic_add(violations_ptr + b, tl.sum(refused_count, axis=0))


def build_kv_indices_checked_triton(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    paged_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    page_owner: torch.Tensor,
    req_owner: torch.Tensor,
    page_size: int,
    zero_page: int,
    allowed_extra: torch.Tensor | None,
    kv_indices: torch.Tensor,
    violations: torch.Tensor,
) -> None:
    """Launch the kernel on validated inputs (see ``build_kv_indices_checked``). MUTATES ``kv_indices``
    and ``violations``."""
    batch = req_pool_indices.numel()
    assert batch > 0, f"{batch=}"
    has_extra = allowed_extra is not None and allowed_extra.shape[1] > 0
    # [B, K] int32 with unit inner stride; req_owner is only a placeholder pointer when there are no extras
    extra = allowed_extra.contiguous() if allowed_extra is not None and has_extra else req_owner
    _checked_kv_indices_kernel[(batch,)](
        req_to_token,
        req_pool_indices,
        paged_kernel_lens,
        kv_indptr,
        kv_start_idx if kv_start_idx is not None else paged_kernel_lens,
        page_owner,
        req_owner,
        extra,
        kv_indices,
        violations,
        req_to_token.stride(0),
        extra.stride(0) if has_extra else 0,
        extra.shape[1] if has_extra else 0,
        page_owner.numel(),
        page_size,
        zero_page * page_size,
        HAS_START=kv_start_idx is not None,
        HAS_EXTRA=has_extra,
        BLOCK=_BLOCK,
    )
