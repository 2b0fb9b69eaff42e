"""Build attention ``kv_indices`` while checking that every gathered page belongs to the request.

Our checked version of SGLang's ``create_flashinfer_kv_indices_triton``. For request ``b`` it gathers
``req_to_token[req_pool_indices[b], start_b : start_b + paged_kernel_lens[b]]`` into
``kv_indices[kv_indptr[b] : kv_indptr[b] + paged_kernel_lens[b]]`` and, per gathered slot ``s``::

    page  = s // page_size
    owner = page_owner[page]                        (FREE pages have owner -1)
    ok    = owner >= 0 and (owner == req_owner[b] or owner in allowed_extra[b, :])
    out   = s                                       if ok
            zero_page * page_size + s % page_size   otherwise  (and violations[b] += 1)

A slot that is negative or past the owner table also counts as a violation. Negative owner ids (FREE, and the
``-1`` padding of ``allowed_extra``) never grant access, so a FREE page is refused even for a request whose
``req_owner`` is -1. The zero page must be kept all-zero by the caller (scrubbed once, never allocated).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sglang_iso_kernels._backend import resolve_use_triton

_INDEX_DTYPES = (torch.int32, torch.int64)


class CheckedKvIndices(NamedTuple):
    """Result of :func:`build_kv_indices_checked`."""

    kv_indices: torch.Tensor  # [sum(paged_kernel_lens)] int32 slot ids; refused slots point into the zero page
    violations: torch.Tensor  # [B] int32 refused slots per request (added to the caller's tensor if given)


class CheckedSlots(NamedTuple):
    """Result of :func:`checked_gather_slots`."""

    slots: torch.Tensor  # [n] slot ids, same dtype as the input; refused slots point into the zero page
    violations: torch.Tensor  # [] int64 number of refused slots (a tensor, so no host sync is forced)


def build_kv_indices_checked(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    paged_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    page_owner: torch.Tensor,
    req_owner: torch.Tensor,
    *,
    page_size: int,
    zero_page: int,
    allowed_extra: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    violations: torch.Tensor | None = None,
    use_triton: bool | None = None,
) -> CheckedKvIndices:
    """Gather each request's slots into a CSR ``kv_indices`` stream, redirecting pages it may not read.

    Args:
        req_to_token: ``[R, L]`` int32 request row -> slot table (read only).
        req_pool_indices: ``[B]`` int32/int64 row of each request in ``req_to_token``.
        paged_kernel_lens: ``[B]`` int32/int64 tokens to gather per request.
        kv_indptr: ``[B+1]`` int32/int64 output offsets (tokens); request ``b`` writes
            ``kv_indices[kv_indptr[b] : kv_indptr[b] + paged_kernel_lens[b]]``.
        kv_start_idx: ``[B]`` int32/int64 first token column per request, or None for 0.
        page_owner: ``[num_pages]`` int32 owner slot of each page; -1 = FREE.
        req_owner: ``[B]`` int32 namespace (owner) slot of each request.
        page_size: tokens per page, >= 1.
        zero_page: page id in ``[0, num_pages)`` whose slots are always zero; refused slots read from it.
        allowed_extra: ``[B, K]`` int32 extra owner slots (e.g. shared namespaces) each request may read,
            padded with -1; None for none.
        kv_indices: ``[>= kv_indptr[B]]`` int32 output to fill (MUTATED); None allocates one of
            ``kv_indptr[B]`` elements (a host sync). Elements outside the requests' ranges are untouched.
        violations: ``[B]`` int32 counters, MUTATED by adding each request's refused-slot count; None
            allocates zeros.
        use_triton: True forces the Triton kernel, False the torch implementation, None picks Triton on
            CUDA or under ``TRITON_INTERPRET=1``.

    Returns:
        ``CheckedKvIndices(kv_indices, violations)``.

    Raises:
        ValueError: a tensor has the wrong rank, dtype, length or device, or ``page_size``/``zero_page`` is
            out of range.
    """
    batch = _validate_build(
        req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_start_idx, page_owner, req_owner,
        page_size, zero_page, allowed_extra, kv_indices, violations,
    )  # fmt: skip
    device = req_to_token.device
    if kv_indices is None:
        total = int(kv_indptr[-1]) if batch > 0 else 0
        kv_indices = torch.empty(total, dtype=torch.int32, device=device)  # [total]
    if violations is None:
        violations = torch.zeros(batch, dtype=torch.int32, device=device)  # [B]
    if batch == 0:
        return CheckedKvIndices(kv_indices, violations)
    if resolve_use_triton(use_triton, device):
        from sglang_iso_kernels._kv_indices_triton import build_kv_indices_checked_triton

        build_kv_indices_checked_triton(
            req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_start_idx, page_owner, req_owner,
            page_size, zero_page, allowed_extra, kv_indices, violations,
        )  # fmt: skip
    else:
        _build_torch(
            req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_start_idx, page_owner, req_owner,
            page_size, zero_page, allowed_extra, kv_indices, violations,
        )  # fmt: skip
    return CheckedKvIndices(kv_indices, violations)


def build_kv_indices_checked_torch(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    paged_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    page_owner: torch.Tensor,
    req_owner: torch.Tensor,
    *,
    page_size: int,
    zero_page: int,
    allowed_extra: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    violations: torch.Tensor | None = None,
) -> CheckedKvIndices:
    """:func:`build_kv_indices_checked` with ``use_triton=False`` (the reference implementation)."""
    return build_kv_indices_checked(
        req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_start_idx, page_owner, req_owner,
        page_size=page_size, zero_page=zero_page, allowed_extra=allowed_extra, kv_indices=kv_indices,
        violations=violations, use_triton=False,
    )  # fmt: skip


def checked_gather_slots(
    slots: torch.Tensor,
    page_owner: torch.Tensor,
    req_owner: int,
    *,
    page_size: int,
    zero_page: int,
    allowed_extra: torch.Tensor | None = None,
) -> CheckedSlots:
    """Check one request's slot ids (the torch_native attention path); nothing is mutated.

    Args:
        slots: ``[n]`` int32/int64 slot ids the request is about to read.
        page_owner: ``[num_pages]`` int32 owner slot per page; -1 = FREE.
        req_owner: the request's owner (namespace) slot.
        page_size: tokens per page, >= 1.
        zero_page: page id in ``[0, num_pages)`` that is always zero.
        allowed_extra: ``[K]`` int32 extra owner slots the request may read, -1 padded; None for none.

    Returns:
        ``CheckedSlots(slots, violations)``: refused slots replaced by ``zero_page * page_size + s % page_size``.

    Raises:
        ValueError: wrong rank, dtype or device, or ``page_size``/``zero_page`` out of range.
    """
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.dtype not in _INDEX_DTYPES:
        raise ValueError("slots must be a 1-D int32/int64 tensor")
    _check_owner_table(page_owner, page_size, zero_page, slots.device)
    extra = None
    if allowed_extra is not None:
        _check_tensor("allowed_extra", allowed_extra, 1, (torch.int32,), slots.device)
        extra = allowed_extra.long()[None, :].expand(slots.numel(), -1)  # [n, K]
    owners = torch.full_like(slots, int(req_owner), dtype=torch.int64)  # [n]
    safe, bad = _check_slots(slots.long(), owners, extra, page_owner, page_size, zero_page)
    return CheckedSlots(safe.to(slots.dtype), bad.sum())


# ---------------------------------------------------------------------------------------------------------
# private helpers


def _check_slots(
    slots: torch.Tensor,
    owners: torch.Tensor,
    extra: torch.Tensor | None,
    page_owner: torch.Tensor,
    page_size: int,
    zero_page: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Core rule on flat tensors: ``slots [N]`` int64, ``owners [N]`` int64 (the reader of each slot),
    ``extra [N, K]`` int64 or None. Returns ``(safe [N] int64, refused [N] bool)``."""
    num_pages = page_owner.numel()
    page = torch.div(slots, page_size, rounding_mode="floor")  # [N]
    in_range = (slots >= 0) & (page < num_pages)  # [N] bool
    owner = page_owner.long()[page.clamp(0, num_pages - 1)]  # [N] int64
    owner = torch.where(in_range, owner, torch.full_like(owner, -1))
    ok = (owner >= 0) & (owner == owners)  # [N] bool
    if extra is not None and extra.shape[1] > 0:
        ok |= (owner >= 0) & ((extra == owner[:, None]) & (extra >= 0)).any(dim=1)
    offset = torch.where(slots >= 0, slots % page_size, torch.zeros_like(slots))  # [N] int64
    safe = torch.where(ok, slots, zero_page * page_size + offset)  # [N] int64
    return safe, ~ok


def _build_torch(
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
    """Vectorized torch version; fills ``kv_indices`` and adds into ``violations`` (both MUTATED)."""
    device = req_to_token.device
    batch = req_pool_indices.numel()
    lens = paged_kernel_lens.long()  # [B]
    req_of = torch.repeat_interleave(torch.arange(batch, device=device), lens)  # [N] request of each token
    first = torch.cumsum(lens, 0) - lens  # [B] token offset of each request in the flat order
    col = torch.arange(req_of.numel(), device=device) - first[req_of]  # [N] column within the request
    col_src = col + kv_start_idx.long()[req_of] if kv_start_idx is not None else col  # [N] source column
    slots = req_to_token[req_pool_indices.long()[req_of], col_src].long()  # [N] int64
    extra = allowed_extra.long()[req_of] if allowed_extra is not None else None  # [N, K]
    safe, refused = _check_slots(slots, req_owner.long()[req_of], extra, page_owner, page_size, zero_page)
    kv_indices[kv_indptr.long()[req_of] + col] = safe.to(kv_indices.dtype)
    violations.index_add_(0, req_of, refused.to(violations.dtype))


def _check_tensor(
    name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...], device: torch.device
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != ndim or t.dtype not in dtypes:
        names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must be a {ndim}-D {names} tensor")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but req_to_token/slots are on {device}")
    return t


def _check_owner_table(page_owner: torch.Tensor, page_size: int, zero_page: int, device: torch.device) -> None:
    _check_tensor("page_owner", page_owner, 1, (torch.int32,), device)
    if page_owner.numel() == 0:
        raise ValueError("page_owner must cover at least one page")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    if isinstance(zero_page, bool) or not isinstance(zero_page, int) or not 0 <= zero_page < page_owner.numel():
        raise ValueError(f"zero_page must be an int in [0, {page_owner.numel()}), got {zero_page!r}")


def _validate_build(
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
    kv_indices: torch.Tensor | None,
    violations: torch.Tensor | None,
) -> int:
    """Check ranks, dtypes, lengths and devices; return the batch size ``B``."""
    if not isinstance(req_to_token, torch.Tensor) or req_to_token.dim() != 2 or req_to_token.dtype != torch.int32:
        raise ValueError("req_to_token must be a 2-D int32 tensor [R, L]")
    device = req_to_token.device
    _check_tensor("req_pool_indices", req_pool_indices, 1, _INDEX_DTYPES, device)
    batch = req_pool_indices.numel()
    lengths = {
        "paged_kernel_lens": (_check_tensor("paged_kernel_lens", paged_kernel_lens, 1, _INDEX_DTYPES, device), batch),
        "kv_indptr": (_check_tensor("kv_indptr", kv_indptr, 1, _INDEX_DTYPES, device), batch + 1),
        "req_owner": (_check_tensor("req_owner", req_owner, 1, (torch.int32,), device), batch),
    }
    if kv_start_idx is not None:
        lengths["kv_start_idx"] = (_check_tensor("kv_start_idx", kv_start_idx, 1, _INDEX_DTYPES, device), batch)
    if violations is not None:
        lengths["violations"] = (_check_tensor("violations", violations, 1, (torch.int32,), device), batch)
    for name, (t, want) in lengths.items():
        if t.numel() != want:
            raise ValueError(f"{name} must have {want} elements (batch size {batch}), got {t.numel()}")
    if allowed_extra is not None:
        _check_tensor("allowed_extra", allowed_extra, 2, (torch.int32,), device)
        if allowed_extra.shape[0] != batch:
            raise ValueError(f"allowed_extra must be [B={batch}, K], got {tuple(allowed_extra.shape)}")
    if kv_indices is not None:
        _check_tensor("kv_indices", kv_indices, 1, (torch.int32,), device)
    _check_owner_table(page_owner, page_size, zero_page, device)
    return batch
