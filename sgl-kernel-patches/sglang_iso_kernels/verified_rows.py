"""The host route's memory of what it verified: a decode step checks its new column, not the whole window.

:func:`~sglang_iso_kernels.row_check.clean_rows_host` decides a clean CPU batch by reading every slot of every
window and its page's owner: at a decode step of one 528-token row that is 528 scattered reads of the owner table
before every forward, and on this path they cost more than their count says (the table's cache lines are cold
after a forward, and the reads evict the model's). Between two decode steps of a row, though, nothing it read can
change unseen when

* the row's verified columns ``[0, upto)`` still hold the slots they held then (compared with a copy: one
  contiguous read of each, so a slot planted or rewritten there by any code sends the row back to the full read),
* its owner slot is the one it had then, and
* no page in its verified columns changed owner since: the caller announces every release, clear or re-marking of
  a page (:meth:`VerifiedWindows.changed`, :meth:`VerifiedWindows.forget_all`), and before the memory is next read
  (:meth:`VerifiedWindows.settle`) every row is forgotten if an announced page is still held by a remembered
  column (``held``: per page, how many remembered columns lie on it). A row freed in between is forgotten by
  itself first, so the pages a finished request gives back (its own, held by no other remembered row) forget
  nothing. The only other change, adopting a FREE page, never touches a slot that was verified (a verified slot's
  page was owned, not FREE).

:func:`clean_decode_verified` (:class:`DecodeRoute` for a caller with fixed tables) then decides a decode step
from the new column alone, with the same adoption rule as the full read. Anything else (a row without a memory, a
prefix that differs, a new slot that is not FREE or its owner's, two owners new to one page) is left undecided for
the full read, which records the rows again when clean.
Host tensors and lists only; the memory is per table, scheduler thread only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import numpy as np


class VerifiedWindows:
    """For each ``req_to_token`` row: the columns the host route last found clean, their slots, and the row's
    owner slot then. ``upto[row] == 0`` means nothing is remembered (the full read decides the row).

    ``held[page]`` counts the remembered columns whose slot lies on ``page`` (every row's ``copy[row, :upto[row]]``);
    :meth:`check` recounts it from the copies."""

    _PENDING_LIMIT = 64  # announcements kept before settling at once (a run of extend steps reads no memory)

    def __init__(self, rows: int, width: int, pages: int, page_size: int) -> None:
        self.copy = np.zeros((rows, width), dtype=np.int32)
        """``copy[row, :upto[row]]``: the slots the row held when they were verified."""
        self.upto = [0] * rows
        self.owner = [-1] * rows
        self.page_size = page_size
        self.held = np.zeros(pages, dtype=np.int64)
        self._changed: list[np.ndarray] = []  # pages that changed owner since the last settle
        self.settled_forgetting = 0
        """Settles that forgot every row (an announced page was held): each costs the next decode step a full read."""
        self.decided = 0
        """Decode steps :func:`clean_decode_verified` decided from the memory."""

    def forget_all(self) -> None:
        """Every page may have changed owner (the pool was cleared): no remembered column holds any longer."""
        self.upto = [0] * len(self.upto)
        self.held.fill(0)
        self._changed.clear()

    def changed(self, pages: np.ndarray) -> None:
        """``pages`` changed owner (released, re-marked); the rows holding one are forgotten at :meth:`settle`."""
        if pages.size:
            self._changed.append(pages.astype(np.intp))  # (a copy: the caller's array may be reused)
            if len(self._changed) > self._PENDING_LIMIT:
                self.settle()

    def settle(self) -> None:
        """Forget every row if a page announced since the last settle lies in a remembered column. Safe at any time
        between the change and the next read of the memory: rows forgotten in between only lower ``held``."""
        if not self._changed:
            return
        pages = self._changed[0] if len(self._changed) == 1 else np.concatenate(self._changed)
        self._changed.clear()
        inside = pages[(pages >= 0) & (pages < self.held.size)]
        if inside.size != pages.size or self.held[inside].any():
            self.settled_forgetting += 1
            self.forget_all()

    def forget(self, rows: Iterable[int]) -> None:
        for row in rows:
            known = self.upto[row]
            if known:
                np.subtract.at(self.held, self._pages(self.copy[row, :known]), 1)
                self.upto[row] = 0

    def record(self, req_to_token: np.ndarray, rows: list[int], ends: list[int], row_owner: np.ndarray) -> None:
        """Remember ``req_to_token[row, :end]`` of each row, just found clean (every slot its owner's or readable)."""
        self.forget(rows)
        limit = self.held.size * self.page_size
        for row, end in zip(rows, ends, strict=True):
            if not 0 < end <= self.copy.shape[1]:
                continue
            window = req_to_token[row, :end]
            if int(window.min()) < 0 or int(window.max()) >= limit:
                continue  # NOTE: a slot off the table is never remembered (the full read keeps deciding the row)
            self.copy[row, :end] = window
            np.add.at(self.held, self._pages(self.copy[row, :end]), 1)
            self.upto[row] = end
            self.owner[row] = int(row_owner[row])

    def check(self) -> bool:
        """True when ``held`` equals its count from the remembered copies (tests; a full pass over the copies)."""
        want = np.zeros_like(self.held)
        for row, known in enumerate(self.upto):
            if known:
                np.add.at(want, self._pages(self.copy[row, :known]), 1)
        return bool(np.array_equal(want, self.held))

    def _pages(self, slots: np.ndarray) -> np.ndarray:
        pages = slots.astype(np.intp)
        return pages // self.page_size if self.page_size != 1 else pages


class DecodeRoute:
    """:func:`clean_decode_verified` bound to one set of host tables, for a caller that decides every decode step.

    The tables are read and written through flat memoryviews made here once: a step then indexes and slices them
    with CPython's own item access instead of numpy indexing. It runs after a forward, when every code path it takes
    is a cache miss, so fewer and smaller ones matter more than the count of operations (in a CPU server: 16 instead
    of 30 us per step for one row, 38 instead of 56 for eight). The old columns are still compared as bytes (one
    ``memcmp``). All five arrays must be C-contiguous ``int32`` (``held``: ``int64``), ``req_to_token`` as wide as
    the memory's copy.

    Raises:
        ValueError: a table of another type, layout or width.
    """

    def __init__(
        self, verified: VerifiedWindows, req_to_token: np.ndarray, row_owner: np.ndarray, page_owner: np.ndarray
    ) -> None:
        if req_to_token.shape != verified.copy.shape:
            raise ValueError(f"req_to_token {req_to_token.shape} is not the memory's {verified.copy.shape}")
        self.verified = verified
        self._slots = _flat(req_to_token, np.int32, "i")
        self._copy = _flat(verified.copy, np.int32, "i")
        self._row_owner = _flat(row_owner, np.int32, "i")
        self._page_owner = _flat(page_owner, np.int32, "i")
        self._held = _flat(verified.held, np.int64, "q")
        self._rows, self._width = req_to_token.shape
        self._limit = min(page_owner.size, verified.held.size) * verified.page_size

    def decide(self, rows: list[int], ends: list[int]) -> bool:
        """Decide a decode step (row ``rows[b]`` writes column ``ends[b] - 1``) from its new columns, when every
        row's columns before it were verified and still hold the same slots; True when clean (new pages adopted,
        memory extended), False when the full read must decide (nothing changed then). MUTATES the page owners
        (only on True)."""
        verified = self.verified
        if verified._changed:
            verified.settle()
        slots, copy, row_owner, page_owner = self._slots, self._copy, self._row_owner, self._page_owner
        upto, owners_then, width, page_size = verified.upto, verified.owner, self._width, verified.page_size
        new: list[tuple[int, int, int, int, int]] = []
        for row, end in zip(rows, ends, strict=True):
            if not 0 <= row < self._rows:
                return False
            known = upto[row]
            if known == 0 or known != end - 1 or end > width:
                return False
            owner = row_owner[row]
            if owner < 0 or owner != owners_then[row]:
                return False
            at = row * width + known
            if slots[at - known : at].tobytes() != copy[at - known : at].tobytes():
                return False  # NOTE: a slot was rewritten since it was verified: the full read looks at all of them
            slot = slots[at]
            if not 0 <= slot < self._limit:
                return False
            page = slot // page_size
            current = page_owner[page]
            if current != -1 and current != owner:
                return False  # (a readable shared page, or a foreign one: the full read decides and counts)
            new.append((row, end, at, page, owner))
        if len(new) > 1:
            first: dict[int, int] = {}
            for _, _, _, page, owner in new:
                if first.setdefault(page, owner) != owner:
                    return False  # two owners new to one page: the full read settles it by the larger owner
        held = self._held
        for row, end, at, page, owner in new:
            page_owner[page] = owner
            copy[at] = slots[at]
            held[page] += 1
            upto[row] = end
        verified.decided += 1
        return True


def _flat(array: np.ndarray, dtype: type, fmt: Literal["i", "q"]) -> memoryview[int]:
    """A flat memoryview of ``array`` in the native format ``fmt`` (the array's own memory)."""
    if array.dtype != dtype or not array.flags.c_contiguous:
        raise ValueError(f"a {array.dtype} table (C-contiguous {np.dtype(dtype)} expected)")
    return array.data.cast("B").cast(fmt)


def clean_decode_verified(
    req_to_token: np.ndarray,
    rows: list[int],
    ends: list[int],
    row_owner: np.ndarray,
    page_owner: np.ndarray,
    page_size: int,
    verified: VerifiedWindows,
) -> bool:
    """:meth:`DecodeRoute.decide` on these tables (bound for this call); False for another page size."""
    if page_size != verified.page_size:
        return False
    return DecodeRoute(verified, req_to_token, row_owner, page_owner).decide(rows, ends)
