"""The host route's memory of what it verified: a decode step checks its new column, not the whole window.

:func:`~sglang_iso_kernels.row_check.clean_rows_host` decides a clean CPU batch by reading every slot of every
window and its page's owner: at a decode step of one 528-token row that is 528 scattered reads of the owner table
before every forward, and on this path they cost more than their count says (the table's cache lines are cold
after a forward, and the reads evict the model's). Between two decode steps of a row, though, nothing it read can
change unseen when

* the row's verified columns ``[0, upto)`` still hold the slots they held then (compared with a copy: one
  contiguous read of each, so a slot planted or rewritten there by any code sends the row back to the full read),
* its owner slot is the one it had then, and
* no page changed owner since: the caller forgets every row on each release, clear or re-marking of a page
  (:meth:`VerifiedWindows.forget_all`); the only other change, adopting a FREE page, never touches a slot that was
  verified (a verified slot's page was owned, not FREE).

:func:`clean_decode_verified` then decides a decode step from the new column alone, with the same adoption rule as
the full read. Anything else (a row without a memory, a prefix that differs, a new slot that is not FREE or its
owner's, two owners new to one page) is left undecided for the full read, which records the rows again when clean.
Host tensors and lists only; the memory is per table, scheduler thread only.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class VerifiedWindows:
    """For each ``req_to_token`` row: the columns the host route last found clean, their slots, and the row's
    owner slot then. ``upto[row] == 0`` means nothing is remembered (the full read decides the row)."""

    def __init__(self, rows: int, width: int) -> None:
        self.copy = np.zeros((rows, width), dtype=np.int32)
        """``copy[row, :upto[row]]``: the slots the row held when they were verified."""
        self.upto = [0] * rows
        self.owner = [-1] * rows

    def forget_all(self) -> None:
        """A page changed owner (released, cleared, re-marked): no remembered column holds any longer."""
        self.upto = [0] * len(self.upto)

    def forget(self, rows: Iterable[int]) -> None:
        for row in rows:
            self.upto[row] = 0

    def record(self, req_to_token: np.ndarray, rows: list[int], ends: list[int], row_owner: np.ndarray) -> None:
        """Remember ``req_to_token[row, :end]`` of each row, just found clean (every slot its owner's or readable)."""
        for row, end in zip(rows, ends, strict=True):
            if 0 < end <= self.copy.shape[1]:
                self.copy[row, :end] = req_to_token[row, :end]
                self.upto[row] = end
                self.owner[row] = int(row_owner[row])
            else:
                self.upto[row] = 0


def clean_decode_verified(
    req_to_token: np.ndarray,
    rows: list[int],
    ends: list[int],
    row_owner: np.ndarray,
    page_owner: np.ndarray,
    page_size: int,
    verified: VerifiedWindows,
) -> bool:
    """Decide a decode step (row ``rows[b]`` writes column ``ends[b] - 1``) from its new columns, when every row's
    columns before it were verified and still hold the same slots; True when clean (new pages adopted, memory
    extended), False when the full read must decide (nothing changed then). MUTATES ``page_owner`` (only on True).
    """
    upto, copy, owners_then = verified.upto, verified.copy, verified.owner
    limit = page_owner.size * page_size
    width = req_to_token.shape[1]
    pages: list[int] = []
    owners: list[int] = []
    for row, end in zip(rows, ends, strict=True):
        known = upto[row]
        if known == 0 or known != end - 1 or end > width:
            return False
        owner = int(row_owner[row])
        if owner < 0 or owner != owners_then[row]:
            return False
        if req_to_token[row, :known].tobytes() != copy[row, :known].tobytes():
            return False  # NOTE: a slot was rewritten since it was verified: the full read looks at all of them
        slot = int(req_to_token[row, known])
        if not 0 <= slot < limit:
            return False
        page = slot // page_size
        current = int(page_owner[page])
        if current != -1 and current != owner:
            return False  # (a readable shared page, or a foreign one: the full read decides and counts)
        pages.append(page)
        owners.append(owner)
    if len(set(pages)) != len(pages) and len(set(zip(pages, owners, strict=True))) != len(set(pages)):
        return False  # two owners new to one page: the full read settles it by the larger owner
    for row, end, page, owner in zip(rows, ends, pages, owners, strict=True):
        page_owner[page] = owner
        copy[row, end - 1] = req_to_token[row, end - 1]
        upto[row] = end
    return True
