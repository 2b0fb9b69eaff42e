"""Sanitize the ``req_to_token`` row windows of a whole batch in place, before the forward reads them.

Every attention backend (FlashInfer, Triton, FlashAttention, torch_native, CUDA graph replay) reads a
request's slots from its ``req_to_token`` row, so fixing the rows before the forward covers them all.
For request ``b`` with row ``r = req_pool_indices[b]``, owner ``me = row_owner[r]`` and window
``req_to_token[r, 0 : seq_lens[b]]``::

    columns >= write_start[b]   (the tokens this step writes): their pages are adopted,
                                page_owner[page] = me, if the page is FREE (-1) or already me
    every column, slot s:       page = s // page_size, owner = page_owner[page]
                                ok   = owner >= 0 and (owner == me or owner in allowed[me, :])
                                not ok -> req_to_token[r, col] = zero_page * page_size + s % page_size
                                          and violations[b] += 1

Rows whose owner is FREE (-1, not a request sglang-iso saw allocated) are left alone. Two owners that
adopt the same FREE page in one step: the larger owner slot keeps it, the other is refused (deterministic).

Cost is proportional to ``sum(seq_lens)``, independent of the pool size, with no host sync: the caller
passes the total token count it already holds on the host (SGLang's ``seq_lens_sum``).
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_iso_kernels._backend import resolve_use_triton

_INDEX_DTYPES = (torch.int32, torch.int64)


def sanitize_rows(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    write_start: torch.Tensor,
    page_owner: torch.Tensor,
    row_owner: torch.Tensor,
    allowed: torch.Tensor,
    *,
    page_size: int,
    zero_page: int,
    total_tokens: int,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Adopt this step's pages, then redirect every foreign or free slot of each row to the zero page.

    Args:
        req_to_token: ``[R, L]`` int32 row -> slot table. MUTATED: refused slots are replaced.
        req_pool_indices: ``[B]`` int32/int64 row of each request.
        seq_lens: ``[B]`` int32/int64 window length (tokens) of each request.
        write_start: ``[B]`` int32/int64 first column this step writes (extend prefix length, or
            ``seq_len - 1`` for decode).
        page_owner: ``[P]`` int32 owner slot of each page, -1 = FREE. MUTATED: adopted pages.
        row_owner: ``[R]`` int32 owner slot of each row, -1 = not tracked (skipped).
        allowed: ``[S, K]`` int32 slots owner ``o`` may read besides its own in ``allowed[o]``, -1 padded;
            every owner slot in ``row_owner`` must be ``< S``.
        page_size: tokens per page, >= 1.
        zero_page: page id in ``[0, P)`` that is always zero.
        total_tokens: ``sum(seq_lens)`` as a host int (passed in so nothing syncs).
        use_triton: True forces the Triton kernel (on CPU: under ``TRITON_INTERPRET=1``), False torch, None
            Triton on CUDA and torch on CPU.

    Returns:
        ``[B]`` int32 refused slots per request (a device tensor; reading it is the caller's sync).

    Raises:
        ValueError: a tensor has the wrong rank, dtype, length or device, or a size is out of range.
    """
    batch = _validate(
        req_to_token, req_pool_indices, seq_lens, write_start, page_owner, row_owner, allowed,
        page_size, zero_page, total_tokens,
    )  # fmt: skip
    violations = torch.zeros(batch, dtype=torch.int32, device=req_to_token.device)  # [B]
    if batch == 0 or total_tokens == 0:
        return violations
    if resolve_use_triton(use_triton, req_to_token.device):
        from sglang_iso_kernels._row_check_triton import sanitize_rows_triton

        sanitize_rows_triton(
            req_to_token, req_pool_indices, seq_lens, write_start, page_owner, row_owner, allowed,
            page_size, zero_page, violations,
        )  # fmt: skip
    elif req_to_token.device.type == "cpu" and _clean_on_cpu(
        req_to_token, req_pool_indices, seq_lens, write_start, page_owner, row_owner, page_size, total_tokens
    ):
        pass  # every slot was its row owner's: nothing to redirect, nothing to count
    else:
        _sanitize_torch(
            req_to_token, req_pool_indices, seq_lens, write_start, page_owner, row_owner, allowed,
            page_size, zero_page, total_tokens, violations,
        )  # fmt: skip
    return violations


def clean_rows_host(
    req_to_token: torch.Tensor,
    rows: list[int],
    write_start: list[int],
    seq_lens: list[int],
    page_owner: torch.Tensor,
    row_owner: torch.Tensor,
    allowed: torch.Tensor | None = None,
    *,
    page_size: int,
) -> bool:
    """The CPU fast path of :func:`sanitize_rows` for a caller that holds the batch as host lists: adopt this
    step's pages and say whether every slot of every window is its row owner's (or, with ``allowed``, one its
    owner may read: a shared prefix, the zero page), with no argument checks and no result tensor (this runs
    before every forward; the tables are the ones the caller validated once).

    Returns True when the batch is clean (adoption done); False when :func:`sanitize_rows` must decide it (a
    foreign, FREE or out-of-range slot, an untracked row, or two owners new to one page). MUTATES
    ``page_owner`` (adopted pages only, exactly as the full pass would). All tensors on the CPU, ``req_to_token``
    int32, ``page_owner``, ``row_owner`` and ``allowed`` int32.
    """
    extra = allowed.numpy() if allowed is not None else None
    return _clean_host(req_to_token, rows, write_start, seq_lens, page_owner, row_owner, page_size, extra)


# ---------------------------------------------------------------------------------------------------------
# private helpers


def _sanitize_torch(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    write_start: torch.Tensor,
    page_owner: torch.Tensor,
    row_owner: torch.Tensor,
    allowed: torch.Tensor,
    page_size: int,
    zero_page: int,
    total_tokens: int,
    violations: torch.Tensor,
) -> None:
    """Vectorized torch version (CPU, or CUDA without Triton). MUTATES every table it is documented to."""
    device = req_to_token.device
    batch = req_pool_indices.numel()
    lens = seq_lens.long()  # [B]
    # NOTE: output_size keeps repeat_interleave from reading the lengths back to the host.
    req_of = torch.repeat_interleave(torch.arange(batch, device=device), lens, output_size=total_tokens)  # [N]
    first = torch.cumsum(lens, 0) - lens  # [B] flat offset of each request
    col = torch.arange(total_tokens, device=device) - first[req_of]  # [N] column in the row
    row = req_pool_indices[req_of].long()  # [N]
    slots = req_to_token[row, col].long()  # [N]
    me = row_owner[row].long()  # [N] (index first: never convert a whole table)
    tracked = me >= 0
    num_pages = page_owner.numel()
    page = torch.div(slots, page_size, rounding_mode="floor")
    in_range = (slots >= 0) & (page < num_pages)
    page_c = torch.where(in_range, page, torch.zeros_like(page))  # [N] safe index
    current = page_owner[page_c].long()
    new = tracked & in_range & (col >= write_start.long()[req_of])
    adopt = new & ((current == -1) | (current == me))
    # NOTE: amax makes duplicate pages race-free: tokens that do not adopt contribute -2 (no change),
    # and two owners adopting one FREE page resolve to the larger slot, the other is then refused.
    proposal = torch.where(adopt, me, torch.full_like(me, -2)).to(page_owner.dtype)
    page_owner.scatter_reduce_(0, page_c, proposal, reduce="amax", include_self=True)
    owner = torch.where(in_range, page_owner[page_c].long(), torch.full_like(page_c, -1))  # [N]
    me_c = torch.where(tracked, me, torch.zeros_like(me))
    extra = allowed[me_c].long()  # [N, K]
    ok = (owner >= 0) & ((owner == me) | ((extra == owner[:, None]) & (extra >= 0)).any(dim=1))
    refused = tracked & ~ok
    offset = torch.where(slots >= 0, slots % page_size, torch.zeros_like(slots))
    safe = torch.where(refused, zero_page * page_size + offset, slots)
    # NOTE: accumulate a delta (0 for kept slots) instead of storing every slot back, so a slot the
    # scheduler rewrites concurrently is never overwritten with a stale copy.
    req_to_token.index_put_((row, col), (safe - slots).to(req_to_token.dtype), accumulate=True)
    violations.index_add_(0, req_of, refused.to(violations.dtype))


def _clean_on_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    write_start: torch.Tensor,
    page_owner: torch.Tensor,
    row_owner: torch.Tensor,
    page_size: int,
    total_tokens: int,
    allowed: np.ndarray | None = None,
) -> bool:
    """CPU fast path: adopt this step's pages, then say whether every slot of every row is its owner's (or, with
    ``allowed``, one its owner may read).

    On CPU reading a value back costs nothing, so the common case (no foreign slot) needs only a copy of the
    row windows and one comparison per token. Returns False on anything else (a foreign, FREE, shared or
    out-of-range slot, an untracked row) and the caller runs the full pass, whose adoption of the same pages is
    then a no-op. MUTATES ``page_owner`` (adopted pages only, exactly as the full pass would).

    NOTE: it works on numpy views of the tensors (no copy, same memory): a small numpy operation costs about a
    tenth of a torch one, and this runs before every forward, for batches of a few rows.
    """
    rows, starts, lens = req_pool_indices.tolist(), write_start.tolist(), seq_lens.tolist()
    return _clean_host(req_to_token, rows, starts, lens, page_owner, row_owner, page_size, allowed, total_tokens)


def _clean_host(
    req_to_token: torch.Tensor,
    rows_list: list[int],
    starts_list: list[int],
    lens_list: list[int],
    page_owner: torch.Tensor,
    row_owner: torch.Tensor,
    page_size: int,
    allowed: np.ndarray | None,
    total_tokens: int | None = None,
) -> bool:
    """:func:`_clean_on_cpu` on host lists (what :func:`clean_rows_host` is): a few rows are read in place, a larger
    decode step as its windows joined end to end, any other batch as one padded copy or window by window.

    NOTE: page owners are read with ``ndarray.take``, which costs about half of fancy indexing for the same
    gather (7k slots: 6 against 15 us on this path); with the joined windows a decode step of 32 rows of 880 tokens
    is decided in about 70 us, against 140 us for the padded copy (2-vCPU host, in a loop)."""
    if len(rows_list) <= _ROW_LOOP_MAX:
        return _clean_by_row(
            req_to_token.numpy(), rows_list, starts_list, lens_list, row_owner.numpy(), page_owner.numpy(),
            page_size, allowed,
        )  # fmt: skip
    if total_tokens is None:
        total_tokens = sum(lens_list)
    rows = np.asarray(rows_list, dtype=np.int64)
    owners = row_owner.numpy()[rows]  # [B]
    if bool((owners < 0).any()):
        return False  # untracked rows are skipped by the full pass
    lens = np.asarray(lens_list, dtype=np.int64)
    starts = np.minimum(np.maximum(np.asarray(starts_list, dtype=np.int64), 0), lens)
    width = int(lens.max())
    if width > req_to_token.shape[1]:
        return False
    if bool((starts == lens - 1).all()) and int(lens.min()) > 0:
        decided = _clean_decode(req_to_token.numpy(), rows_list, lens, owners, page_owner.numpy(), page_size, allowed)
        if decided is not None:
            return decided
    if width * lens.size <= 2 * total_tokens + _PAD_SLACK:
        return _clean_padded(
            req_to_token.numpy(), rows, starts, lens, owners, page_owner.numpy(), page_size, width, allowed
        )
    rows_t, starts_t, lens_t, owners_t = (torch.from_numpy(x) for x in (rows, starts, lens, owners))
    segments = _segments_small if owners.size <= _SMALL_BATCH else _segments_large
    slots, me = segments(req_to_token, rows_t, torch.zeros_like(lens_t), lens_t, owners_t, total_tokens)
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= page_owner.numel() * page_size):
        return False
    new_slots, new_me = segments(req_to_token, rows_t, starts_t, lens_t, owners_t, int((lens - starts).sum()))
    _adopt(page_owner, torch.div(new_slots.long(), page_size, rounding_mode="floor"), new_me)
    pages = torch.div(slots.long(), page_size, rounding_mode="floor")
    return bool(torch.equal(page_owner[pages], me))


def _adopt(page_owner: torch.Tensor, new_pages: torch.Tensor, new_me: torch.Tensor) -> None:
    """The full pass's adoption rule on the new columns only: FREE or own pages, the larger owner wins a race."""
    if new_pages.numel():
        current = page_owner[new_pages]
        proposal = torch.where((current == -1) | (current == new_me), new_me, torch.full_like(new_me, -2))
        page_owner.scatter_reduce_(0, new_pages, proposal, reduce="amax", include_self=True)


# NOTE: up to this many rows the windows are read in place, row by row (no copy, no mask): at one decode row
# of 520 tokens 28 us against 52 us for the padded copy below (measured on this path, 2-vCPU host), which runs
# before every forward of a lone request.
_ROW_LOOP_MAX = 2


def _clean_by_row(
    req_to_token: np.ndarray,
    rows: list[int],
    write_start: list[int],
    lens: list[int],
    row_owner: np.ndarray,
    page_owner: np.ndarray,
    page_size: int,
    allowed: np.ndarray | None = None,
) -> bool:
    """:func:`_clean_on_cpu` reading each window in place, for a batch of a few rows given as host lists (three
    ``tolist`` calls instead of a dozen array operations: this runs before every forward of a lone request).
    Adopts only when every new page is FREE or its row owner's and no page is new to two owners (that race is
    left to the full pass, which settles it by the larger owner); MUTATES ``page_owner`` then, exactly as the full
    pass would."""
    if len(rows) == 1:
        return _clean_one_row(req_to_token, rows[0], write_start[0], lens[0], row_owner, page_owner, page_size, allowed)
    windows, new_pages, new_owners, owners = [], [], [], set()
    for row, start, end in zip(rows, write_start, lens, strict=True):
        owner = int(row_owner[row])
        pages = _window_pages(req_to_token, row, owner, end, page_owner.size, page_size)
        if pages is None:
            return False
        if end == 0:
            continue
        windows.append((pages, owner))
        owners.add(owner)
        start = min(max(start, 0), end)
        if start < end:
            new_pages.append(pages[start:])
            new_owners.append(np.full(end - start, owner, dtype=page_owner.dtype))
    if new_pages:
        new = new_pages[0] if len(new_pages) == 1 else np.concatenate(new_pages)
        me = new_owners[0] if len(new_owners) == 1 else np.concatenate(new_owners)
        current = page_owner.take(new)
        if not bool(((current == -1) | (current == me)).all()):
            return False
        if len(new_pages) > 1 and len(owners) > 1:
            order = np.argsort(new, kind="stable")
            same_page = new[order][1:] == new[order][:-1]
            if bool((same_page & (me[order][1:] != me[order][:-1])).any()):
                return False
        page_owner[new] = me
    return all(_window_ok(page_owner.take(pages), owner, allowed) for pages, owner in windows)


def _clean_one_row(
    req_to_token: np.ndarray,
    row: int,
    start: int,
    end: int,
    row_owner: np.ndarray,
    page_owner: np.ndarray,
    page_size: int,
    allowed: np.ndarray | None = None,
) -> bool:
    """:func:`_clean_by_row` for a batch of one row (no race between owners is possible): a handful of array
    operations, a decode step's single new slot adopted with scalar reads (the lone request's every forward)."""
    owner = int(row_owner[row])
    pages = _window_pages(req_to_token, row, owner, end, page_owner.size, page_size)
    if pages is None:
        return False
    if end == 0:
        return True
    start = min(max(start, 0), end)
    if end - start == 1:
        page = int(pages[start])
        current = int(page_owner[page])
        if current != -1 and current != owner:
            return False
        page_owner[page] = owner
    elif start < end:
        new = pages[start:]
        owners = page_owner.take(new)
        if not bool(((owners == -1) | (owners == owner)).all()):
            return False
        page_owner[new] = owner
    return _window_ok(page_owner.take(pages), owner, allowed)


def _window_pages(
    req_to_token: np.ndarray, row: int, owner: int, end: int, num_pages: int, page_size: int
) -> np.ndarray | None:
    """The pages of ``row``'s window ``[0, end)`` (a view for page size 1), or None when the fast path cannot
    decide it: an untracked row (the full pass skips it), a window outside the table, a slot outside the pool."""
    if owner < 0 or not 0 <= end <= req_to_token.shape[1]:
        return None
    slots = req_to_token[row, :end]
    if end and int(slots.view(np.uint32).max()) >= num_pages * page_size:
        return None  # (a negative slot reads as a huge unsigned one: one reduction checks both ends)
    return slots if page_size == 1 else slots // page_size


def _window_ok(current: np.ndarray, owner: int, allowed: np.ndarray | None) -> bool:
    """Whether every page owner in ``current`` (one window's) is ``owner`` or, with ``allowed``, one it may read."""
    ok = current == owner
    if bool(ok.all()):
        return True
    other = current[~ok]
    return _readable(other, np.full(other.size, owner, dtype=np.int64), allowed)


def _readable(current: np.ndarray, owners: np.ndarray, allowed: np.ndarray | None) -> bool:
    """Whether each ``current[i]`` (a page's owner, not the row's) is in ``allowed[owners[i]]``, as the full pass
    decides (a FREE page never is)."""
    if allowed is None or int(owners.max()) >= allowed.shape[0] or int(current.min()) < 0:
        return False
    extra = allowed[owners]  # [N, K]
    return bool(((extra == current[:, None]) & (extra >= 0)).any(axis=1).all())


# NOTE: a batch whose padded windows (batch x longest window) hold at most twice its tokens plus this many is
# copied as one ``[B, W]`` block and masked: a handful of array operations whatever the batch size (measured on
# this path at 32 rows of 880 tokens: 0.36 ms, against 2.2 ms copying the windows row by row). A batch of
# very unequal windows is copied window by window instead, so the copy never grows past the batch's tokens.
_PAD_SLACK = 4096


def _clean_padded(
    req_to_token: np.ndarray,
    rows: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    owners: np.ndarray,
    page_owner: np.ndarray,
    page_size: int,
    width: int,
    allowed: np.ndarray | None = None,
) -> bool:
    """:func:`_clean_on_cpu` on one ``[B, width]`` copy of the windows, columns past a window masked out.
    MUTATES ``page_owner`` (a view of the tensor): the same adoption as :func:`_adopt`."""
    cols = np.arange(width)
    outside = cols >= lens[:, None]  # [B, W] columns past each window
    slots = req_to_token[rows, :width]  # only the windows copied (int32)
    slots[outside] = 0
    if int(slots.view(np.uint32).max()) >= page_owner.size * page_size:
        return False  # (a negative slot reads as a huge unsigned one)
    pages = slots if page_size == 1 else slots // page_size
    valid = ~outside
    new = valid & (cols >= starts[:, None])
    if new.any():
        new_pages = pages[new]
        new_me = np.broadcast_to(owners[:, None], pages.shape)[new]
        current = page_owner.take(new_pages)
        proposal = np.where((current == -1) | (current == new_me), new_me, -2).astype(page_owner.dtype)
        np.maximum.at(page_owner, new_pages, proposal)  # scatter-amax, as the torch route's scatter_reduce
    return _block_ok(page_owner.take(pages), owners, outside, allowed)


def _clean_decode(
    req_to_token: np.ndarray,
    rows: list[int],
    lens: np.ndarray,
    owners: np.ndarray,
    page_owner: np.ndarray,
    page_size: int,
    allowed: np.ndarray | None = None,
) -> bool | None:
    """:func:`_clean_on_cpu` for a decode step of several rows (one new column each, at the window's end): the
    windows joined end to end (one copy of the batch's tokens, no padding or mask), the new columns adopted by a
    plain store. None when a page is new to two rows (the allocator hands each row its own; that race is the general
    route's to settle, by the larger owner). MUTATES ``page_owner`` (a view of the tensor) when it adopts."""
    slots = np.concatenate([req_to_token[row, :end] for row, end in zip(rows, lens.tolist(), strict=True)])
    if int(slots.view(np.uint32).max()) >= page_owner.size * page_size:
        return False  # (a negative slot reads as a huge unsigned one)
    pages = slots if page_size == 1 else slots // page_size
    new_pages = pages[np.cumsum(lens) - 1]
    ordered = np.sort(new_pages)
    if bool((ordered[1:] == ordered[:-1]).any()):
        return None
    current = page_owner.take(new_pages)
    if not bool(((current == -1) | (current == owners)).all()):
        return False
    page_owner[new_pages] = owners
    current = page_owner.take(pages)
    first = int(owners[0])
    if bool((owners == first).all()):  # one owner (a lone tenant's batch): a scalar comparison
        return _window_ok(current, first, allowed)
    me = np.repeat(owners.astype(np.int64), lens)
    ok = current == me
    return bool(ok.all()) or _readable(current[~ok], me[~ok], allowed)


def _block_ok(current: np.ndarray, owners: np.ndarray, outside: np.ndarray, allowed: np.ndarray | None) -> bool:
    """:func:`_window_ok` for a ``[B, W]`` block of page owners, columns ``outside`` the windows ignored."""
    ok = (current == owners[:, None]) | outside
    if bool(ok.all()):
        return True
    row, col = np.nonzero(~ok)
    return _readable(current[row, col], owners[row].astype(np.int64), allowed)


# NOTE: up to this batch size the windows are copied row by row: ``repeat_interleave`` opens a thread-parallel
# region for any size on CPU, which costs milliseconds when the cores are busy (measured on a loaded 2-core
# host: 2 ms for 4 x 1.2k tokens, against 24 us for the slices); past it the per-row Python loop costs more.
_SMALL_BATCH = 64


def _segments_small(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    start: torch.Tensor,
    end: torch.Tensor,
    owners: torch.Tensor,
    total: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns ``start[b] .. end[b]`` of each request's row and its owner per token, concatenated ``[total]``."""
    spans = list(zip(rows.tolist(), start.tolist(), end.tolist(), owners.tolist(), strict=True))
    slots = torch.cat([req_to_token[r, s:e] for r, s, e, _ in spans])
    me = torch.cat([torch.full((e - s,), o, dtype=owners.dtype) for _, s, e, o in spans])
    return slots, me


def _segments_large(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    start: torch.Tensor,
    end: torch.Tensor,
    owners: torch.Tensor,
    total: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`_segments_small`, vectorized."""
    sizes = end - start
    first = torch.cumsum(sizes, 0) - sizes  # [B]
    base = rows.long() * req_to_token.shape[1] + start - first
    flat = torch.repeat_interleave(base, sizes, output_size=total) + torch.arange(total, dtype=base.dtype)
    return req_to_token.view(-1)[flat], torch.repeat_interleave(owners, sizes, output_size=total)


def _check(name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...], device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != ndim or t.dtype not in dtypes:
        names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must be a {ndim}-D {names} tensor")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but req_to_token is on {device}")
    return t


def _validate(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    write_start: torch.Tensor,
    page_owner: torch.Tensor,
    row_owner: torch.Tensor,
    allowed: torch.Tensor,
    page_size: int,
    zero_page: int,
    total_tokens: int,
) -> int:
    if not isinstance(req_to_token, torch.Tensor) or req_to_token.dim() != 2 or req_to_token.dtype != torch.int32:
        raise ValueError("req_to_token must be a 2-D int32 tensor [R, L]")
    device = req_to_token.device
    batch = _check("req_pool_indices", req_pool_indices, 1, _INDEX_DTYPES, device).numel()
    for name, t in (("seq_lens", seq_lens), ("write_start", write_start)):
        if _check(name, t, 1, _INDEX_DTYPES, device).numel() != batch:
            raise ValueError(f"{name} must have {batch} elements (batch size), got {t.numel()}")
    _check("page_owner", page_owner, 1, (torch.int32,), device)
    _check("row_owner", row_owner, 1, (torch.int32,), device)
    _check("allowed", allowed, 2, (torch.int32,), device)
    if page_owner.numel() == 0 or allowed.shape[0] == 0 or allowed.shape[1] == 0:
        raise ValueError("page_owner and allowed must not be empty")
    if row_owner.numel() < req_to_token.shape[0]:
        raise ValueError(f"row_owner must cover all {req_to_token.shape[0]} rows, got {row_owner.numel()}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    if isinstance(zero_page, bool) or not isinstance(zero_page, int) or not 0 <= zero_page < page_owner.numel():
        raise ValueError(f"zero_page must be an int in [0, {page_owner.numel()}), got {zero_page!r}")
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, int) or total_tokens < 0:
        raise ValueError(f"total_tokens must be an int >= 0, got {total_tokens!r}")
    return batch
