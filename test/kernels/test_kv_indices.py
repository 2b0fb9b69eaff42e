"""build_kv_indices_checked / checked_gather_slots against a plain-Python reference.

Pool layout used by every scenario (page ids)::

    0            zero page (FREE, always redirected to)
    1 .. 12      owned round-robin by slots 0, 1, 2 (tenants) and 3 (a shared namespace), then shuffled
    13 .. 15     FREE
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from sglang_iso_kernels import build_kv_indices_checked, build_kv_indices_checked_torch, checked_gather_slots
from test.kernels.conftest import SEEDS

NUM_PAGES, ZERO_PAGE, SHARED, NUM_TENANTS = 16, 0, 3, 3
FREE = -1
SENTINEL = -7777
R, L, B = 6, 24, 4  # req_to_token rows, max context (tokens), batch size


class Scenario(NamedTuple):
    req_to_token: torch.Tensor  # [R, L] int32
    req_pool_indices: torch.Tensor  # [B] int64
    lens: torch.Tensor  # [B] int32
    kv_indptr: torch.Tensor  # [B+1] int32, with gaps between requests
    kv_start_idx: torch.Tensor | None  # [B] int32
    page_owner: torch.Tensor  # [NUM_PAGES] int32
    req_owner: torch.Tensor  # [B] int32
    allowed_extra: torch.Tensor | None  # [B, 2] int32, -1 padded
    planted: list[int]  # per request: slots planted that must be refused


def _pages_of(page_owner: list[int], owner: int) -> list[int]:
    return [p for p, o in enumerate(page_owner) if o == owner and p != ZERO_PAGE]


def _scenario(
    seed: int, page_size: int, *, foreign: int = 0, free: int = 0, shared: int = 0, extra: bool = False, start=True
) -> Scenario:
    """Random batch whose rows hold only the request's own pages, then ``foreign`` slots of other tenants'
    pages, ``free`` slots of FREE pages and ``shared`` slots of the shared namespace planted per request."""
    gen = torch.Generator().manual_seed(seed)

    def randint(lo: int, hi: int) -> int:  # inclusive lo, exclusive hi
        return int(torch.randint(lo, hi, (1,), generator=gen))

    owners = [FREE] + [i % (NUM_TENANTS + 1) for i in range(12)] + [FREE] * 3
    middle = owners[1:13]
    owners[1:13] = [middle[i] for i in torch.randperm(12, generator=gen).tolist()]

    def slot_in(pages: list[int]) -> int:
        return pages[randint(0, len(pages))] * page_size + randint(0, page_size)

    rows = torch.randperm(R, generator=gen)[:B].tolist()
    req_owner = [randint(0, NUM_TENANTS) for _ in range(B)]
    table = [[slot_in(range(NUM_PAGES)) for _ in range(L)] for _ in range(R)]  # garbage outside live ranges
    starts = [randint(0, 4) if start else 0 for _ in range(B)]
    lens = [randint(0, L - s + 1) for s in starts]
    lens[0] = max(lens[0], foreign + free + shared)  # room for the planted slots
    lens[0] = min(lens[0], L - starts[0])
    planted = []
    for b in range(B):
        own = _pages_of(owners, req_owner[b])
        row = table[rows[b]]
        for j in range(lens[b]):
            row[starts[b] + j] = slot_in(own)
        cols = (torch.randperm(lens[b], generator=gen) + starts[b]).tolist()
        others = [p for t in range(NUM_TENANTS) if t != req_owner[b] for p in _pages_of(owners, t)]
        kinds = [others] * foreign + [_pages_of(owners, FREE)] * free + [_pages_of(owners, SHARED)] * shared
        for col, pages in zip(cols, kinds, strict=False):
            row[col] = slot_in(pages)
        refused = min(lens[b], foreign + free) + (0 if extra else max(0, min(lens[b] - foreign - free, shared)))
        planted.append(refused)
    gaps = [randint(0, 3) for _ in range(B)]
    indptr = [0]
    for b in range(B):
        indptr.append(indptr[-1] + lens[b] + gaps[b])
    i32 = torch.int32
    return Scenario(
        req_to_token=torch.tensor(table, dtype=i32),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        lens=torch.tensor(lens, dtype=i32),
        kv_indptr=torch.tensor(indptr, dtype=i32),
        kv_start_idx=torch.tensor(starts, dtype=i32) if start else None,
        page_owner=torch.tensor(owners, dtype=i32),
        req_owner=torch.tensor(req_owner, dtype=i32),
        allowed_extra=torch.tensor([[SHARED, -1]] * B, dtype=i32) if extra else None,
        planted=planted,
    )


def _reference(sc: Scenario, page_size: int, *, check: bool = True) -> tuple[dict[int, int], list[int]]:
    """Plain-Python gather (SGLang semantics) plus the ownership rule. Returns (position -> slot, violations)."""
    table, owners = sc.req_to_token.tolist(), sc.page_owner.tolist()
    extra = sc.allowed_extra.tolist() if sc.allowed_extra is not None else [[] for _ in range(B)]
    starts = sc.kv_start_idx.tolist() if sc.kv_start_idx is not None else [0] * B
    out: dict[int, int] = {}
    violations = [0] * len(sc.lens)
    for b, (row, n) in enumerate(zip(sc.req_pool_indices.tolist(), sc.lens.tolist(), strict=True)):
        readers = {o for o in [int(sc.req_owner[b]), *extra[b]] if o >= 0}
        for j in range(n):
            s = table[row][starts[b] + j]
            owner = owners[s // page_size] if 0 <= s < len(owners) * page_size else FREE
            ok = owner >= 0 and owner in readers
            if not check or ok:
                out[int(sc.kv_indptr[b]) + j] = s
            else:
                out[int(sc.kv_indptr[b]) + j] = ZERO_PAGE * page_size + (s % page_size if s >= 0 else 0)
                violations[b] += 1
    return out, violations


def _run(sc: Scenario, page_size: int, use_triton: bool, device, violations_start: int = 0):
    """Run the builder on a sentinel-poisoned output 3 elements longer than needed."""
    on = lambda t: None if t is None else t.to(device)  # noqa: E731
    total = int(sc.kv_indptr[-1]) + 3
    kv_indices = torch.full((total,), SENTINEL, dtype=torch.int32, device=device)  # [total]
    violations = torch.full((B,), violations_start, dtype=torch.int32, device=device)  # [B]
    result = build_kv_indices_checked(
        on(sc.req_to_token), on(sc.req_pool_indices), on(sc.lens), on(sc.kv_indptr), on(sc.kv_start_idx),
        on(sc.page_owner), on(sc.req_owner), page_size=page_size, zero_page=ZERO_PAGE,
        allowed_extra=on(sc.allowed_extra), kv_indices=kv_indices, violations=violations, use_triton=use_triton,
    )  # fmt: skip
    assert result.kv_indices is kv_indices and result.violations is violations
    return kv_indices.cpu(), violations.cpu()


def _assert_matches(kv_indices: torch.Tensor, expected: dict[int, int]) -> None:
    want = torch.full_like(kv_indices, SENTINEL)
    for pos, slot in expected.items():
        want[pos] = slot
    bad = (kv_indices != want).nonzero().flatten().tolist()
    assert not bad, f"mismatch at {bad[:8]}: got {kv_indices[bad[:8]].tolist()} want {want[bad[:8]].tolist()}"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("start", [False, True])
def test_own_pages_unchanged(seed: int, page_size: int, start: bool, use_triton: bool, device) -> None:
    """Positive control: only own pages -> identical to the unchecked SGLang gather, zero violations."""
    sc = _scenario(seed, page_size, start=start)
    kv_indices, violations = _run(sc, page_size, use_triton, device)
    plain, _ = _reference(sc, page_size, check=False)
    _assert_matches(kv_indices, plain)
    assert violations.tolist() == [0] * B


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("page_size", [1, 4])
def test_foreign_and_free_pages_redirected_and_counted(seed: int, page_size: int, use_triton: bool, device) -> None:
    sc = _scenario(seed, page_size, foreign=2, free=2, shared=1)
    kv_indices, violations = _run(sc, page_size, use_triton, device, violations_start=5)
    expected, expected_violations = _reference(sc, page_size)
    _assert_matches(kv_indices, expected)
    assert expected_violations == sc.planted, "reference disagrees with the planted count"
    assert violations.tolist() == [5 + v for v in sc.planted], "violations must be added to the caller's counters"
    assert sum(sc.planted) > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_allowed_extra_shared_pages_pass(seed: int, use_triton: bool, device) -> None:
    page_size = 4
    sc = _scenario(seed, page_size, foreign=1, free=1, shared=3, extra=True)
    kv_indices, violations = _run(sc, page_size, use_triton, device)
    expected, expected_violations = _reference(sc, page_size)
    _assert_matches(kv_indices, expected)
    assert violations.tolist() == expected_violations == sc.planted


def test_out_of_table_slots_and_unowned_reader_refused(use_triton: bool, device) -> None:
    """Slots past the owner table or negative are refused; a request with owner -1 cannot read FREE pages."""
    page_size = 2
    sc = _scenario(0, page_size, extra=True)
    table = sc.req_to_token.clone()
    row = int(sc.req_pool_indices[0])
    col = int(sc.kv_start_idx[0])
    lens = sc.lens.clone()
    lens[0] = 3
    table[row, col : col + 3] = torch.tensor([NUM_PAGES * page_size, -3, 13 * page_size + 1], dtype=torch.int32)
    indptr = torch.zeros(B + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    req_owner = sc.req_owner.clone()
    req_owner[0] = FREE
    sc = sc._replace(req_to_token=table, lens=lens, kv_indptr=indptr, req_owner=req_owner)
    kv_indices, violations = _run(sc, page_size, use_triton, device)
    assert kv_indices[:3].tolist() == [0, 0, 1]
    assert int(violations[0]) == 3
    expected, expected_violations = _reference(sc, page_size)
    _assert_matches(kv_indices, expected)
    assert violations.tolist() == expected_violations


def test_allocates_outputs_and_empty_batch(use_triton: bool, device) -> None:
    sc = _scenario(1, 4, foreign=1)
    args = [t.to(device) for t in sc[:4]]
    kwargs = dict(page_size=4, zero_page=ZERO_PAGE, use_triton=use_triton)
    result = build_kv_indices_checked(*args, sc.kv_start_idx.to(device), sc.page_owner.to(device),
                                      sc.req_owner.to(device), **kwargs)  # fmt: skip
    assert result.kv_indices.shape == (int(sc.kv_indptr[-1]),) and result.kv_indices.dtype == torch.int32
    assert result.violations.tolist() == _reference(sc, 4)[1]
    empty = torch.empty(0, dtype=torch.int32, device=device)
    result = build_kv_indices_checked(
        sc.req_to_token.to(device), torch.empty(0, dtype=torch.int64, device=device), empty,
        torch.zeros(1, dtype=torch.int32, device=device), None, sc.page_owner.to(device), empty, **kwargs,
    )  # fmt: skip
    assert result.kv_indices.numel() == 0 and result.violations.numel() == 0


def test_torch_and_reference_entry_point_agree() -> None:
    sc = _scenario(2, 4, foreign=1, free=1)
    kv_torch = build_kv_indices_checked_torch(*sc[:7], page_size=4, zero_page=ZERO_PAGE)
    expected, expected_violations = _reference(sc, 4)
    kv = kv_torch.kv_indices
    assert {pos: int(kv[pos]) for pos in expected} == expected
    assert kv_torch.violations.tolist() == expected_violations


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_checked_gather_slots(seed: int, page_size: int, device) -> None:
    gen = torch.Generator().manual_seed(seed)
    owners = torch.randint(-1, 4, (NUM_PAGES,), generator=gen, dtype=torch.int32)  # [NUM_PAGES]
    slots = torch.randint(-2, NUM_PAGES * page_size + 3, (40,), generator=gen)  # [40] int64, some out of range
    me, extra = 1, torch.tensor([SHARED, -1], dtype=torch.int32)
    result = checked_gather_slots(
        slots.to(device), owners.to(device), me, page_size=page_size, zero_page=ZERO_PAGE,
        allowed_extra=extra.to(device),
    )  # fmt: skip
    want, refused = [], 0
    for s in slots.tolist():
        owner = int(owners[s // page_size]) if 0 <= s < NUM_PAGES * page_size else FREE
        if owner >= 0 and owner in (me, SHARED):
            want.append(s)
        else:
            want.append(ZERO_PAGE * page_size + (s % page_size if s >= 0 else 0))
            refused += 1
    assert result.slots.cpu().tolist() == want and result.slots.dtype == slots.dtype
    assert int(result.violations) == refused
    assert 0 < refused < 40, "scenario must mix allowed and refused slots"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"req_to_token": lambda t: t.long()}, "req_to_token"),
        ({"kv_indptr": lambda t: t[:-1]}, "kv_indptr"),
        ({"req_owner": lambda t: t.long()}, "req_owner"),
        ({"page_owner": lambda t: t.float()}, "page_owner"),
        ({"allowed_extra": lambda t: t[:1]}, "allowed_extra"),
        ({"zero_page": lambda z: NUM_PAGES}, "zero_page"),
        ({"page_size": lambda p: 0}, "page_size"),
    ],
)
def test_rejects_bad_arguments(change: dict, match: str) -> None:
    sc = _scenario(0, 4, extra=True)
    kwargs = dict(
        req_to_token=sc.req_to_token, req_pool_indices=sc.req_pool_indices, paged_kernel_lens=sc.lens,
        kv_indptr=sc.kv_indptr, kv_start_idx=sc.kv_start_idx, page_owner=sc.page_owner, req_owner=sc.req_owner,
        page_size=4, zero_page=ZERO_PAGE, allowed_extra=sc.allowed_extra,
    )  # fmt: skip
    for name, fn in change.items():
        kwargs[name] = fn(kwargs[name])
    with pytest.raises(ValueError, match=match):
        build_kv_indices_checked(**kwargs)


@pytest.mark.gpu
def test_gpu_triton_matches_torch_large() -> None:
    gen = torch.Generator().manual_seed(9)
    page_size, num_pages, batch, width = 16, 4096, 64, 4096
    owners = torch.randint(-1, 8, (num_pages,), generator=gen, dtype=torch.int32).cuda()
    table = torch.randint(0, num_pages * page_size, (batch, width), generator=gen, dtype=torch.int32).cuda()
    lens = torch.randint(0, width, (batch,), generator=gen, dtype=torch.int32).cuda()
    indptr = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indptr[1:] = torch.cumsum(lens, 0)
    rows = torch.randperm(batch, generator=gen).cuda()
    req_owner = torch.randint(0, 8, (batch,), generator=gen, dtype=torch.int32).cuda()
    extra = torch.randint(-1, 8, (batch, 3), generator=gen, dtype=torch.int32).cuda()
    args = (table, rows, lens, indptr, None, owners, req_owner)
    a = build_kv_indices_checked(*args, page_size=page_size, zero_page=0, allowed_extra=extra, use_triton=True)
    b = build_kv_indices_checked(*args, page_size=page_size, zero_page=0, allowed_extra=extra, use_triton=False)
    assert torch.equal(a.kv_indices, b.kv_indices) and torch.equal(a.violations, b.violations)
