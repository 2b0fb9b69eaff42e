"""The decode route from remembered windows (``verified_rows``) against the full pass.

Rows start clean and remembered; then anything may happen before the decode step, as in a server: a slot planted
or rewritten in an old column (not announced), a page released or handed to another owner (announced, as the owner
table does for every page-owner change), a row given to another owner, a new column on a FREE, own, foreign or
shared page or off the pool, a window that moved. Whenever the route says clean, the full pass on the same tables
refuses nothing and leaves the same tables; whenever it says no, it changed nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_iso_kernels.row_check import _sanitize_torch, clean_rows_host
from sglang_iso_kernels.verified_rows import DecodeRoute, VerifiedWindows, clean_decode_verified
from test.kernels.test_row_check import FREE, NUM_PAGES, SHARED, ZERO_PAGE, _allowed

ROWS, WIDTH = 6, 24
EVENTS = ("plant", "release", "reassign", "row owner", "shift")


def _full_pass(req_to_token, rows, ends, page_owner, row_owner, page_size):  # type: ignore[no-untyped-def]
    """The full torch pass of a decode step on copies: (refused per row, req_to_token, page_owner)."""
    rtt, po = req_to_token.clone(), page_owner.clone()
    refused = torch.zeros(len(rows), dtype=torch.int32)
    lens = torch.tensor(ends, dtype=torch.int64)
    _sanitize_torch(
        rtt, torch.tensor(rows, dtype=torch.int64), lens, (lens - 1).clamp(min=0), po, row_owner.clone(),
        _allowed(torch.device("cpu")), page_size, ZERO_PAGE, sum(ends), refused,
    )  # fmt: skip
    return refused, rtt, po


def _clean_rows(data: st.DataObject, page_size: int):  # type: ignore[no-untyped-def]
    """Rows whose windows hold only their owner's pages (owner 0 also the shared page), remembered as clean."""
    page_owner = torch.tensor(
        data.draw(st.lists(st.sampled_from([FREE, 0, 1, 2]), min_size=NUM_PAGES, max_size=NUM_PAGES)),
        dtype=torch.int32,
    )
    page_owner[ZERO_PAGE] = FREE
    page_owner[SHARED] = SHARED
    rows = data.draw(st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=4, unique=True))
    row_owner = torch.full((ROWS,), FREE, dtype=torch.int32)
    req_to_token = torch.zeros(ROWS, WIDTH, dtype=torch.int32)
    ends = []
    for row in rows:
        me = data.draw(st.sampled_from([0, 1, 2]))
        row_owner[row] = me
        own = [p for p in range(NUM_PAGES) if int(page_owner[p]) == me or (me == 0 and p == SHARED)]
        if not own:
            own = [p for p in range(1, NUM_PAGES) if int(page_owner[p]) == FREE][:1] or [1]
            page_owner[own[0]] = me
        slot = st.builds(lambda p, j: p * page_size + j, st.sampled_from(own), st.integers(0, page_size - 1))
        window = data.draw(st.lists(slot, min_size=1, max_size=WIDTH - 2))
        req_to_token[row, : len(window)] = torch.tensor(window, dtype=torch.int32)
        ends.append(len(window))
    allowed = _allowed(torch.device("cpu"))
    starts = [end for end in ends]  # nothing new in the remembered step
    if not clean_rows_host(req_to_token, rows, starts, ends, page_owner, row_owner, allowed, page_size=page_size):
        raise AssertionError("a window of own pages was not found clean")
    verified = VerifiedWindows(ROWS, WIDTH, NUM_PAGES, page_size)
    verified.record(req_to_token.numpy(), rows, ends, row_owner.numpy())
    assert verified.check()
    return page_owner, rows, row_owner, req_to_token, ends, verified


@settings(max_examples=300, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 2, 4]))
def test_the_remembered_route_never_passes_what_the_full_pass_refuses(data: st.DataObject, page_size: int) -> None:
    page_owner, rows, row_owner, req_to_token, ends, verified = _clean_rows(data, page_size)
    events = data.draw(st.lists(st.sampled_from(EVENTS), max_size=3))
    anywhere = st.integers(-2, (NUM_PAGES + 1) * page_size)
    for event in events:
        row = data.draw(st.sampled_from(rows))
        i = rows.index(row)
        if event == "plant":  # any code wrote an old column (not announced)
            req_to_token[row, data.draw(st.integers(0, ends[i] - 1))] = data.draw(anywhere)
        elif event in ("release", "reassign"):  # the table announces every page-owner change but adoption
            page = data.draw(st.integers(1, NUM_PAGES - 1))
            page_owner[page] = FREE if event == "release" else data.draw(st.sampled_from([0, 1, 2]))
            verified.changed(np.array([page]))
        elif event == "row owner":  # a row handed to another request without its alloc hook
            row_owner[row] = data.draw(st.sampled_from([0, 1, 2]))
        elif event == "shift":  # the step's window is not the remembered one plus a column
            ends[i] = data.draw(st.integers(1, WIDTH))
    new_ends = [end if "shift" in events else end + 1 for end in ends]
    for row, end in zip(rows, new_ends, strict=True):
        req_to_token[row, end - 1] = data.draw(anywhere)  # this step's slot: FREE, own, foreign, shared or off
    before_po, before_rtt = page_owner.clone(), req_to_token.clone()
    refused, want_rtt, want_po = _full_pass(req_to_token, rows, new_ends, page_owner, row_owner, page_size)
    po = page_owner.numpy()
    clean = clean_decode_verified(req_to_token.numpy(), rows, new_ends, row_owner.numpy(), po, page_size, verified)
    if clean:
        assert int(refused.sum()) == 0, "the remembered route passed a step the full pass refuses"
        assert torch.equal(page_owner, want_po) and torch.equal(req_to_token, want_rtt)
        assert [verified.upto[r] for r in rows] == new_ends  # the memory covers the new column
    else:
        assert torch.equal(page_owner, before_po) and torch.equal(req_to_token, before_rtt)
    assert verified.check()  # ``held`` still counts the remembered columns


@settings(max_examples=100, deadline=None)
@given(data=st.data(), page_size=st.sampled_from([1, 2, 4]))
def test_an_undisturbed_step_is_decided_by_the_remembered_route(data: st.DataObject, page_size: int) -> None:
    """Positive control for the test above: nothing happened but this step's slot on a FREE page (or its own)."""
    page_owner, rows, row_owner, req_to_token, ends, verified = _clean_rows(data, page_size)
    free = [p for p in range(1, NUM_PAGES) if int(page_owner[p]) == FREE]
    for k, (row, end) in enumerate(zip(rows, ends, strict=True)):
        own = int(req_to_token[row, 0]) // page_size
        page = free[k] if k < len(free) else own
        if int(page_owner[page]) not in (FREE, int(row_owner[row])):
            page = own if int(page_owner[own]) == int(row_owner[row]) else page
        req_to_token[row, end] = page * page_size
    if any(int(page_owner[int(req_to_token[r, e]) // page_size]) not in (FREE, int(row_owner[r])) for r, e in
           zip(rows, ends, strict=True)):  # fmt: skip
        return  # (only the shared page was the row's: its new slot is not one to adopt)
    new_ends = [end + 1 for end in ends]
    refused, _, want_po = _full_pass(req_to_token, rows, new_ends, page_owner, row_owner, page_size)
    assert int(refused.sum()) == 0
    po = page_owner.numpy()
    assert clean_decode_verified(req_to_token.numpy(), rows, new_ends, row_owner.numpy(), po, page_size, verified)
    assert torch.equal(page_owner, want_po)


def test_a_planted_slot_and_a_released_page_send_the_step_to_the_full_pass() -> None:
    """One row, step by step: decided from memory while undisturbed; a planted old column, a released page (the
    announcement the table makes) and a row owner change each hand the step over, and nothing changes then."""
    page_owner = torch.full((NUM_PAGES,), FREE, dtype=torch.int32)
    page_owner[1:4] = 1
    row_owner = torch.tensor([FREE, 1, FREE, FREE, FREE, FREE], dtype=torch.int32)
    req_to_token = torch.zeros(ROWS, WIDTH, dtype=torch.int32)
    req_to_token[1, :3] = torch.tensor([1, 2, 3], dtype=torch.int32)
    verified = VerifiedWindows(ROWS, WIDTH, NUM_PAGES, 1)
    verified.record(req_to_token.numpy(), [1], [3], row_owner.numpy())
    rtt, po, ro = req_to_token.numpy(), page_owner.numpy(), row_owner.numpy()
    rtt[1, 3] = 7
    assert clean_decode_verified(rtt, [1], [4], ro, po, 1, verified) and int(po[7]) == 1  # adopted
    rtt[1, 4], rtt[1, 0] = 8, 9  # the next step's slot, and page 9 (FREE) planted in column 0
    assert not clean_decode_verified(rtt, [1], [5], ro, po, 1, verified) and int(po[8]) == FREE
    rtt[1, 0] = 1
    assert clean_decode_verified(rtt, [1], [5], ro, po, 1, verified)  # control: the same step, undisturbed
    page_owner[2] = FREE  # released (and announced, as the table does)
    verified.changed(np.array([2]))
    rtt[1, 5] = 10
    assert not clean_decode_verified(rtt, [1], [6], ro, po, 1, verified) and int(po[10]) == FREE
    verified.record(rtt, [1], [5], ro)
    ro[1] = 2  # another owner's request in the row
    assert not clean_decode_verified(rtt, [1], [6], ro, po, 1, verified)
    assert np.array_equal(rtt[1, :6], [1, 2, 3, 7, 8, 10])


def _two_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, VerifiedWindows]:
    """Rows 1 (owner 1, pages 1-3) and 2 (owner 2, pages 4-6), both remembered clean."""
    page_owner = torch.full((NUM_PAGES,), FREE, dtype=torch.int32)
    page_owner[1:4], page_owner[4:7] = 1, 2
    row_owner = torch.tensor([FREE, 1, 2, FREE, FREE, FREE], dtype=torch.int32)
    req_to_token = torch.zeros(ROWS, WIDTH, dtype=torch.int32)
    req_to_token[1, :3] = torch.tensor([1, 2, 3], dtype=torch.int32)
    req_to_token[2, :3] = torch.tensor([4, 5, 6], dtype=torch.int32)
    verified = VerifiedWindows(ROWS, WIDTH, NUM_PAGES, 1)
    verified.record(req_to_token.numpy(), [1, 2], [3, 3], row_owner.numpy())
    return page_owner, row_owner, req_to_token, verified


def test_pages_a_freed_row_gives_back_leave_the_other_rows_remembered() -> None:
    """A finished request's row is forgotten, then its pages released: the other row's next step is still decided
    from memory. Control: releasing a page the other row holds sends its step to the full read."""
    page_owner, row_owner, req_to_token, verified = _two_rows()
    rtt, po, ro = req_to_token.numpy(), page_owner.numpy(), row_owner.numpy()
    verified.forget([2])  # row 2 freed (the row pool's free_rows comes after the request's frees: either order)
    po[4:7] = FREE
    verified.changed(np.array([4, 5, 6]))
    rtt[1, 3] = 7
    assert clean_decode_verified(rtt, [1], [4], ro, po, 1, verified) and verified.settled_forgetting == 0
    assert verified.check() and verified.upto[1] == 4

    page_owner, row_owner, req_to_token, verified = _two_rows()
    rtt, po, ro = req_to_token.numpy(), page_owner.numpy(), row_owner.numpy()
    po[2] = FREE  # a page of row 1's remembered columns
    verified.changed(np.array([2]))
    rtt[1, 3] = 7
    assert not clean_decode_verified(rtt, [1], [4], ro, po, 1, verified) and verified.settled_forgetting == 1
    assert verified.upto == [0] * ROWS and verified.check() and int(po[7]) == FREE


def test_a_release_announced_before_the_row_is_freed_forgets_only_when_still_held() -> None:
    """The request's frees come before its row's (SGLang's release order): settled after the row is forgotten, the
    announcement finds the pages held by no one; settled before (the next step comes first), every row is forgotten."""
    page_owner, row_owner, req_to_token, verified = _two_rows()
    rtt, po, ro = req_to_token.numpy(), page_owner.numpy(), row_owner.numpy()
    po[6] = FREE
    verified.changed(np.array([6]))  # row 2's page, row 2 still remembered
    verified.forget([2])
    rtt[1, 3] = 7
    assert clean_decode_verified(rtt, [1], [4], ro, po, 1, verified) and verified.settled_forgetting == 0

    page_owner, row_owner, req_to_token, verified = _two_rows()
    rtt, po, ro = req_to_token.numpy(), page_owner.numpy(), row_owner.numpy()
    po[6] = FREE
    verified.changed(np.array([6]))
    rtt[1, 3] = 7
    assert not clean_decode_verified(rtt, [1], [4], ro, po, 1, verified) and verified.settled_forgetting == 1


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["record", "forget", "announce", "settle", "all"]), st.integers(0, ROWS - 1),
                  st.lists(st.integers(0, NUM_PAGES - 1), max_size=WIDTH - 1)),
        max_size=30,
    ),
    page_size=st.sampled_from([1, 2, 4]),
)  # fmt: skip
def test_held_counts_the_remembered_columns_through_any_sequence(ops, page_size: int) -> None:  # type: ignore[no-untyped-def]
    """``held`` equals its recount after any sequence of records (repeated pages too), forgets, announcements and
    settles; a settle forgets every row exactly when an announced page was held."""
    verified = VerifiedWindows(ROWS, WIDTH, NUM_PAGES, page_size)
    req_to_token = np.zeros((ROWS, WIDTH), dtype=np.int32)
    row_owner = np.ones(ROWS, dtype=np.int32)
    announced: set[int] = set()
    for op, row, pages in ops:
        if op == "record" and pages:
            req_to_token[row, : len(pages)] = [p * page_size for p in pages]
            verified.record(req_to_token, [row], [len(pages)], row_owner)
        elif op == "forget":
            verified.forget([row])
        elif op == "announce":
            verified.changed(np.array(pages, dtype=np.int64))
            announced.update(pages)
        elif op == "settle":
            held = {p for p in announced if verified.held[p] > 0}
            before = verified.settled_forgetting
            verified.settle()
            assert verified.settled_forgetting == before + (1 if held else 0)
            assert not held or verified.upto == [0] * ROWS
            announced.clear()
        else:
            verified.forget_all()
            announced.clear()
        assert verified.check()


def test_the_bound_route_takes_only_its_layout_and_refuses_rows_off_the_table() -> None:
    """``DecodeRoute`` binds C-contiguous int32 tables as wide as the memory (else ValueError, and the owner table
    reads every step in full); a row index off the table is left to the full pass. Control: the same step on a row of
    the table is decided."""
    page_owner, row_owner, req_to_token, verified = _two_rows()
    rtt, po, ro = req_to_token.numpy(), page_owner.numpy(), row_owner.numpy()
    for bad in (rtt.astype(np.int64), np.asfortranarray(rtt), rtt[:, : WIDTH - 1]):
        with pytest.raises(ValueError):
            DecodeRoute(verified, bad, ro, po)
    route = DecodeRoute(verified, rtt, ro, po)
    rtt[1, 3] = 7
    assert not route.decide([ROWS], [4]) and not route.decide([-1], [4]) and int(po[7]) == FREE
    assert route.decide([1], [4]) and int(po[7]) == 1 and verified.check()
