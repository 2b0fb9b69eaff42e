"""sanitize_rows (torch and Triton) against a plain-Python per-request reference.

Pool: pages 0 (zero page, FREE), 1..12 owned round-robin by owners 0, 1, 2 and 3 (a shared namespace that
owner 0 may read), 13..19 FREE. Each request's row holds its own pages, a few planted foreign, free or
shared slots in its prefix, and new tokens on FREE pages it must adopt.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_iso_kernels import row_check
from sglang_iso_kernels.row_check import (
    _clean_on_cpu,
    _sanitize_torch,
    _segments_large,
    _segments_small,
    clean_rows_host,
    sanitize_rows,
)
from test.kernels.conftest import SEEDS

NUM_PAGES, ZERO_PAGE, SHARED, FREE = 20, 0, 3, -1
R, L = 8, 40
ROUTES = {"padded": (10**9, 0), "by window": (-(10**9), 0), "in place by row": (10**9, 10**9)}
"""``(_PAD_SLACK, _ROW_LOOP_MAX)`` values that force each route of the CPU fast path: one padded copy, a copy
window by window, or each window read in place."""


def _allowed(device: torch.device) -> torch.Tensor:
    allowed = torch.full((5, 2), FREE, dtype=torch.int32)
    allowed[0, 0] = SHARED  # owner 0 may read the shared namespace
    allowed[:, 1] = 4  # owner 4 stands for the zero page's slot: everyone may read it
    return allowed.to(device)


def _batch(seed: int, page_size: int, device: torch.device):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    page_owner = [FREE] + [i % 4 for i in range(12)] + [FREE] * 7
    rows = torch.randperm(R, generator=gen)[:4].tolist()
    row_owner = [FREE] * R
    req_to_token = torch.zeros(R, L, dtype=torch.int32)
    seq_lens, write_start = [], []
    free_pages = list(range(13, NUM_PAGES))
    for i, row in enumerate(rows):
        me = i % 3 if i < 3 else FREE  # the fourth row is untracked
        row_owner[row] = me
        own = [p for p, o in enumerate(page_owner) if o == max(me, 0)]
        picks = torch.randint(0, len(own), (6,), generator=gen).tolist()
        prefix = [own[k] * page_size + j % page_size for j, k in enumerate(picks)]
        kind = (seed + i) % 3
        other = [p for p, o in enumerate(page_owner) if o not in (FREE, max(me, 0))]
        if kind == 0:
            prefix[2] = other[0] * page_size  # a foreign page (or the shared one, allowed for owner 0)
        elif kind == 1:
            prefix[3] = free_pages[-1] * page_size + page_size - 1  # a FREE page nobody adopts this step
        new_page = free_pages.pop(0)
        new = [new_page * page_size + j % page_size for j in range(3)]
        window = prefix + new
        req_to_token[row, : len(window)] = torch.tensor(window, dtype=torch.int32)
        seq_lens.append(len(window))
        write_start.append(len(prefix))
    tensors = (
        req_to_token.to(device),
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(seq_lens, dtype=torch.int32, device=device),
        torch.tensor(write_start, dtype=torch.int32, device=device),
        torch.tensor(page_owner, dtype=torch.int32, device=device),
        torch.tensor(row_owner, dtype=torch.int32, device=device),
    )
    return tensors, sum(seq_lens)


def _reference(req_to_token, rows, seq_lens, write_start, page_owner, row_owner, allowed, page_size):  # type: ignore[no-untyped-def]
    rtt, po = req_to_token.tolist(), page_owner.tolist()
    allowed_l, owners = allowed.tolist(), row_owner.tolist()
    violations = []
    for row, n, start in zip(rows.tolist(), seq_lens.tolist(), write_start.tolist(), strict=True):
        me = owners[row]
        if me < 0:
            violations.append(0)
            continue
        for col in range(start, n):
            page = rtt[row][col] // page_size
            if po[page] in (FREE, me):
                po[page] = me
        bad = 0
        for col in range(n):
            slot = rtt[row][col]
            owner = po[slot // page_size]
            if not (owner >= 0 and (owner == me or owner in [a for a in allowed_l[me] if a >= 0])):
                rtt[row][col] = ZERO_PAGE * page_size + slot % page_size
                bad += 1
        violations.append(bad)
    return rtt, po, violations


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("page_size", [1, 4])
def test_sanitize_rows_matches_reference(seed: int, page_size: int, use_triton: bool, device: torch.device) -> None:
    tensors, total = _batch(seed, page_size, device)
    allowed = _allowed(device)
    want_rtt, want_po, want_v = _reference(*tensors, allowed, page_size)
    violations = sanitize_rows(
        *tensors, allowed, page_size=page_size, zero_page=ZERO_PAGE, total_tokens=total, use_triton=use_triton
    )
    req_to_token, page_owner = tensors[0], tensors[4]
    assert violations.tolist() == want_v
    assert req_to_token.tolist() == want_rtt
    assert page_owner.tolist() == want_po
    assert sum(want_v) > 0  # the scenario really plants violations (the test can fail)
    assert any(v == 0 for v in want_v[:3])  # and a clean tracked row stays clean (positive control)


@pytest.mark.parametrize("batch_rows", [[0, 1], [1, 0]])
def test_two_owners_adopting_one_free_page_refuses_one(device: torch.device, batch_rows: list[int]) -> None:
    """The larger owner keeps the page, whichever of the two rows comes first in the batch."""
    req_to_token = torch.zeros(4, 8, dtype=torch.int32, device=device)
    req_to_token[0, 0] = req_to_token[1, 0] = 15  # the same FREE page for two owners
    page_owner = torch.full((NUM_PAGES,), FREE, dtype=torch.int32, device=device)
    row_owner = torch.tensor([1, 2, FREE, FREE], dtype=torch.int32, device=device)
    one = torch.ones(2, dtype=torch.int32, device=device)
    violations = sanitize_rows(
        req_to_token, torch.tensor(batch_rows, device=device), one, one * 0, page_owner, row_owner,
        _allowed(device), page_size=1, zero_page=ZERO_PAGE, total_tokens=2, use_triton=False,
    )  # fmt: skip
    refused = {0: 1, 1: 0}  # row -> refused slots: row 0 (owner 1) loses the race
    assert violations.tolist() == [refused[r] for r in batch_rows] and int(page_owner[15]) == 2
    assert req_to_token[0, 0].item() == ZERO_PAGE and req_to_token[1, 0].item() == 15


def test_empty_batch_and_bad_inputs(device: torch.device) -> None:
    rtt = torch.zeros(2, 4, dtype=torch.int32, device=device)
    owners = torch.full((2,), FREE, dtype=torch.int32, device=device)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    po = torch.full((4,), FREE, dtype=torch.int32, device=device)
    out = sanitize_rows(
        rtt, empty, empty, empty, po, owners, _allowed(device), page_size=1, zero_page=0, total_tokens=0
    )
    assert out.numel() == 0
    with pytest.raises(ValueError, match="seq_lens"):
        sanitize_rows(rtt, empty, empty[:0].float(), empty, po, owners, _allowed(device), page_size=1, zero_page=0,
                      total_tokens=0)  # fmt: skip
    with pytest.raises(ValueError, match="zero_page"):
        sanitize_rows(rtt, empty, empty, empty, po, owners, _allowed(device), page_size=1, zero_page=9, total_tokens=0)


@pytest.mark.gpu
def test_triton_matches_torch_on_a_large_batch() -> None:
    _large_batch_triton_vs_torch(torch.device("cuda"))


def _large_batch_triton_vs_torch(device: torch.device) -> None:
    gen = torch.Generator().manual_seed(7)
    batch, page_size, num_pages, rows = 96, 16, 1 << 16, 128
    lens = torch.randint(1, 3000, (batch,), generator=gen)
    need = [-(-int(n) // page_size) for n in lens]
    pages = torch.randperm(num_pages - 1, generator=gen)[: sum(need) + 1] + 1
    foreign = int(pages[-1])  # owned by owner 2, read by others: refused, whatever the program order
    req_to_token = torch.zeros(rows, 3072, dtype=torch.int32)
    page_owner = torch.full((num_pages,), FREE, dtype=torch.int32)
    page_owner[foreign] = 2
    row_owner = torch.full((rows,), FREE, dtype=torch.int32)
    rows_used = torch.randperm(rows - 1, generator=gen)[:batch] + 1
    start = 0
    for b in range(batch):
        own = pages[start : start + need[b]]
        start += need[b]
        me = b % 4
        page_owner[own[:-1]] = me  # the last page is new in this step (FREE, adopted)
        slots = (own[:, None] * page_size + torch.arange(page_size)).reshape(-1)[: int(lens[b])]
        if b % 3 == 0:
            slots[0] = foreign * page_size
        req_to_token[rows_used[b], : int(lens[b])] = slots.to(torch.int32)
        row_owner[rows_used[b]] = me
    write_start = (lens - 1) // page_size * page_size  # the last page is written in this step
    inputs = [t.to(device) for t in (req_to_token, rows_used, lens, write_start, page_owner, row_owner)]
    outs = []
    for use_triton in (False, True):
        rtt, rws, sl, ws, po, ro = (t.clone() for t in inputs)
        v = sanitize_rows(
            rtt, rws, sl, ws, po, ro, _allowed(device), page_size=page_size, zero_page=ZERO_PAGE,
            total_tokens=int(lens.sum()), use_triton=use_triton,
        )  # fmt: skip
        outs.append((rtt.cpu(), po.cpu(), v.cpu()))
    (rtt_t, po_t, v_t), (rtt_k, po_k, v_k) = outs
    assert int(v_t.sum()) > 0 and torch.equal(v_t, v_k)
    assert torch.equal(rtt_t, rtt_k) and torch.equal(po_t, po_k)


def _draw_batch(data: st.DataObject, page_size: int, max_rows: int = 4, wild: bool = False):  # type: ignore[no-untyped-def]
    """A random pool and batch, mostly clean: ``(page_owner, rows, row_owner, req_to_token, seq_lens,
    write_start)``; ``wild`` adds negative and past-the-pool slots."""
    page_owner = data.draw(st.lists(st.sampled_from([FREE, 0, 1, 2, 3]), min_size=NUM_PAGES, max_size=NUM_PAGES))
    page_owner[ZERO_PAGE] = FREE
    rows = data.draw(st.lists(st.integers(0, R - 1), min_size=1, max_size=max_rows, unique=True))
    row_owner = [FREE] * R
    req_to_token = torch.zeros(R, L, dtype=torch.int32)
    seq_lens, write_start = [], []
    pure = wild and data.draw(st.booleans())  # every row tracked and on its own pages: a clean batch
    for row in rows:
        me = data.draw(st.sampled_from([0, 1, 2] if pure else [0, 1, 2, FREE]))
        row_owner[row] = me
        own = [p for p, o in enumerate(page_owner) if o == me] or [ZERO_PAGE]
        mine = st.builds(lambda p, j: p * page_size + j, st.sampled_from(own), st.integers(0, page_size - 1))
        low, high = (-3, (NUM_PAGES + 2) * page_size) if wild else (0, NUM_PAGES * page_size - 1)
        anywhere = st.integers(low, high)
        token = mine if pure and own != [ZERO_PAGE] else st.one_of(mine, mine, mine, anywhere)
        window = data.draw(st.lists(token, min_size=1, max_size=L))
        req_to_token[row, : len(window)] = torch.tensor(window, dtype=torch.int32)
        seq_lens.append(len(window))
        decode = data.draw(st.booleans())
        write_start.append(len(window) - 1 if decode else data.draw(st.integers(0, len(window))))
    return page_owner, rows, row_owner, req_to_token, seq_lens, write_start


def _with_full_pass(page_owner, rows, row_owner, req_to_token, seq_lens, write_start, page_size):  # type: ignore[no-untyped-def]
    """A drawn batch as ``sanitize_rows``'s tensors, the allowed table, and what the full torch pass makes of copies
    of them (tables and refused slots per request): the reference of the fast-path tests.

    NOTE: the full torch pass is the reference here (it is checked against the per-request reference above); the
    plain reference would differ only where two owners race for one FREE page. Negative or past-the-pool slots are
    the full pass's to redirect; the reference gets the same inputs."""
    tensors = (
        req_to_token,
        torch.tensor(rows, dtype=torch.int64),
        torch.tensor(seq_lens, dtype=torch.int64),
        torch.tensor(write_start, dtype=torch.int64),
        torch.tensor(page_owner, dtype=torch.int32),
        torch.tensor(row_owner, dtype=torch.int32),
    )
    allowed = _allowed(torch.device("cpu"))
    want = [t.clone() for t in tensors]
    want_v = torch.zeros(len(rows), dtype=torch.int32)
    _sanitize_torch(*want, allowed, page_size, ZERO_PAGE, sum(seq_lens), want_v)
    return tensors, allowed, want, want_v


@settings(max_examples=150, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 2, 4]), route=st.sampled_from(sorted(ROUTES)))
def test_cpu_fast_path_matches_reference(data: st.DataObject, page_size: int, route: str) -> None:
    """Random pools and rows, mostly clean (the CPU fast path answers) and sometimes not (it hands over),
    through each of its routes."""
    page_owner, rows, row_owner, req_to_token, seq_lens, write_start = _draw_batch(data, page_size)
    tensors, allowed, want, want_v = _with_full_pass(
        page_owner, rows, row_owner, req_to_token, seq_lens, write_start, page_size
    )
    slack, row_loop = ROUTES[route]
    with mock.patch.object(row_check, "_PAD_SLACK", slack), mock.patch.object(row_check, "_ROW_LOOP_MAX", row_loop):
        violations = sanitize_rows(
            *tensors, allowed, page_size=page_size, zero_page=ZERO_PAGE, total_tokens=sum(seq_lens), use_triton=False
        )
    assert violations.tolist() == want_v.tolist()
    assert torch.equal(tensors[0], want[0]) and torch.equal(tensors[4], want[4])


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_cpu_fast_path_answers_a_clean_batch_alone(route: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control for the test above: a clean batch is decided by the fast path, adoption included."""
    monkeypatch.setattr(row_check, "_PAD_SLACK", ROUTES[route][0])
    monkeypatch.setattr(row_check, "_ROW_LOOP_MAX", ROUTES[route][1])
    req_to_token = torch.zeros(2, 8, dtype=torch.int32)
    req_to_token[0, :3] = torch.tensor([1, 2, 14], dtype=torch.int32)  # own, own, new FREE page
    page_owner = torch.full((NUM_PAGES,), FREE, dtype=torch.int32)
    page_owner[1] = page_owner[2] = 1
    row_owner = torch.tensor([1, FREE], dtype=torch.int32)
    args = (req_to_token, torch.tensor([0]), torch.tensor([3]), torch.tensor([2]), page_owner, row_owner)
    assert _clean_on_cpu(*args, page_size=1, total_tokens=3)
    assert int(page_owner[14]) == 1  # adopted
    req_to_token[0, 1] = 15  # a FREE page in the prefix: not clean, the full pass takes over
    assert not _clean_on_cpu(*args, page_size=1, total_tokens=3)
    req_to_token[0, 1] = 2
    req_to_token[0, 5] = 15  # past the window: not read
    assert _clean_on_cpu(*args, page_size=1, total_tokens=3)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 2, 4]))
def test_host_lists_route_then_full_pass_equals_full_pass(data: st.DataObject, page_size: int) -> None:
    """``clean_rows_host`` (the owner table's first try before every CPU forward) followed, when it says no, by
    the full pass leaves the tables exactly as the full pass alone; when it says yes, the full pass would have
    refused nothing. One row, two and more, decode steps and prefills, slots off either end of the pool."""
    page_owner, rows, row_owner, req_to_token, seq_lens, write_start = _draw_batch(data, page_size, 5, wild=True)
    tensors, allowed, want, want_v = _with_full_pass(
        page_owner, rows, row_owner, req_to_token, seq_lens, write_start, page_size
    )
    extra = allowed if data.draw(st.booleans()) else None  # shared pages readable here, or handed over
    clean = clean_rows_host(tensors[0], rows, write_start, seq_lens, tensors[4], tensors[5], extra, page_size=page_size)
    if clean:
        assert int(want_v.sum()) == 0, "the host route passed a batch the full pass refuses"
    else:
        got_v = torch.zeros(len(rows), dtype=torch.int32)
        _sanitize_torch(*tensors, allowed, page_size, ZERO_PAGE, sum(seq_lens), got_v)
        assert got_v.tolist() == want_v.tolist()
    assert torch.equal(tensors[0], want[0]) and torch.equal(tensors[4], want[4])


def test_host_lists_route_positive_control() -> None:
    """The route answers a clean lone decode row alone (adopting its new page) and hands over a planted one."""
    req_to_token = torch.zeros(2, 8, dtype=torch.int32)
    req_to_token[1, :3] = torch.tensor([1, 2, 14], dtype=torch.int32)
    page_owner = torch.full((NUM_PAGES,), FREE, dtype=torch.int32)
    page_owner[1] = page_owner[2] = 1
    row_owner = torch.tensor([FREE, 1], dtype=torch.int32)
    assert clean_rows_host(req_to_token, [1], [2], [3], page_owner, row_owner, page_size=1)
    assert int(page_owner[14]) == 1
    req_to_token[1, 0] = 5  # a FREE page in an old column
    assert not clean_rows_host(req_to_token, [1], [2], [3], page_owner, row_owner, page_size=1)
    req_to_token[1, 0] = -1  # a negative slot
    assert not clean_rows_host(req_to_token, [1], [2], [3], page_owner, row_owner, page_size=1)
    page_owner[5] = 2
    req_to_token[1, :3] = torch.tensor([1, 2, 5], dtype=torch.int32)  # the new column on another owner's page
    assert not clean_rows_host(req_to_token, [1], [2], [3], page_owner, row_owner, page_size=1)
    assert int(page_owner[5]) == 2
    # A shared prefix its owner may read: decided here with ``allowed``, handed over without it.
    page_owner[6] = SHARED
    allowed = _allowed(torch.device("cpu"))
    row_owner[1] = 0
    page_owner[1] = page_owner[2] = 0
    req_to_token[1, :3] = torch.tensor([6, 1, 2], dtype=torch.int32)
    assert not clean_rows_host(req_to_token, [1], [2], [3], page_owner, row_owner, page_size=1)
    assert clean_rows_host(req_to_token, [1], [2], [3], page_owner, row_owner, allowed, page_size=1)
    row_owner[1] = 1  # owner 1 may not read it
    page_owner[1] = page_owner[2] = 1
    assert not clean_rows_host(req_to_token, [1], [2], [3], page_owner, row_owner, allowed, page_size=1)


def test_host_lists_route_decides_a_decode_step_of_many_rows() -> None:
    """A decode step of several rows (one new column each) is decided on the windows joined end to end: the new
    pages adopted, with one owner or several, a shared page read with ``allowed``; a FREE page in an old column and
    a new page two rows claim are handed over (the full pass counts the one and settles the other)."""
    req_to_token = torch.zeros(R, 8, dtype=torch.int32)
    page_owner = torch.full((NUM_PAGES,), FREE, dtype=torch.int32)
    row_owner = torch.full((R,), FREE, dtype=torch.int32)
    rows, lens = [1, 2, 4], [3, 2, 3]
    windows = {1: [1, 2, 10], 2: [4, 11], 4: [5, 6, 12]}
    for row, window in windows.items():
        req_to_token[row, : len(window)] = torch.tensor(window, dtype=torch.int32)
        row_owner[row] = 1
        page_owner[window[:-1]] = 1
    starts = [n - 1 for n in lens]
    assert clean_rows_host(req_to_token, rows, starts, lens, page_owner, row_owner, page_size=1)  # control
    assert page_owner[[10, 11, 12]].tolist() == [1, 1, 1]
    row_owner[2] = page_owner[4] = 2  # two owners in one step
    req_to_token[2, 1] = 13
    assert clean_rows_host(req_to_token, rows, starts, lens, page_owner, row_owner, page_size=1)
    assert int(page_owner[13]) == 2
    row_owner[2], page_owner[4] = 0, 0
    req_to_token[2, :2] = torch.tensor([SHARED, 4], dtype=torch.int32)  # owner 0 reads the shared page
    page_owner[SHARED] = SHARED
    assert not clean_rows_host(req_to_token, rows, [2, 1, 2], lens, page_owner, row_owner, page_size=1)
    assert clean_rows_host(req_to_token, rows, [2, 1, 2], lens, page_owner, row_owner, _allowed(torch.device("cpu")),
                           page_size=1)  # fmt: skip
    req_to_token[4, 0] = 15  # a FREE page in an old column
    assert not clean_rows_host(req_to_token, rows, starts, lens, page_owner, row_owner, page_size=1)
    req_to_token[4, 0] = 5
    row_owner[2], page_owner[4] = 2, 2
    req_to_token[2, :2] = torch.tensor([4, 16], dtype=torch.int32)
    req_to_token[1, 2] = 16  # a new page two owners claim: the larger takes it, as in the full pass
    assert not clean_rows_host(req_to_token, rows, starts, lens, page_owner, row_owner, page_size=1)
    assert int(page_owner[16]) == 2


@pytest.mark.parametrize("seed", SEEDS)
def test_small_and_large_batch_segments_agree(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    req_to_token = torch.randint(0, 1000, (R, L), dtype=torch.int32, generator=gen)
    rows = torch.randperm(R, generator=gen)[:5]
    end = torch.randint(0, L + 1, (5,), generator=gen)
    start = torch.minimum(torch.randint(0, L + 1, (5,), generator=gen), end)
    owners = torch.randint(0, 4, (5,), dtype=torch.int32, generator=gen)
    total = int((end - start).sum())
    small = _segments_small(req_to_token, rows, start, end, owners, total)
    large = _segments_large(req_to_token, rows, start, end, owners, total)
    assert all(torch.equal(a, b) for a, b in zip(small, large, strict=True)) and small[0].numel() == total
