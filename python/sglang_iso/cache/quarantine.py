"""Quarantine of KV pages a prefill/decode transfer may still read or write (pure logic, no torch).

A transfer engine reads pages on the prefill side and writes them on the decode
side while the scheduler goes on. SGLang frees a request's pages when the
request ends, which can be before the engine has stopped touching them (an
abort on prefill; a decode-side drain timeout). A page re-issued then is read
by, or written for, the wrong request.

Lifecycle of one transfer (``key``)::

    fence(key, pages)           IN_FLIGHT: frees of these pages are held back
      |-- succeeded(key)        -> held pages are freed now (the engine is done)
      '-- failed(key, probe)    DRAINING until probe() is True -> freed
                                 '-- deadline passes: TIMED_OUT, still held (counted, logged);
                                     freed only once probe() says drained, or by reclaim_timed_out()

A page fenced by several transfers (a shared prefix read by two) is held until
the last one lets go. Pages handed back by this class go to the allocator's own
release path, where sglang-iso's scrubber zeroes them before reuse.
Single-threaded (the scheduler thread).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

DrainProbe = Callable[[], bool | None]
"""True: the engine will not touch the pages again; False or None (unknown): keep them."""


class TransferState(enum.Enum):
    IN_FLIGHT = "in_flight"
    DRAINING = "draining"
    TIMED_OUT = "timed_out"


@dataclass
class _Transfer:
    pages: set[int]  # page ids this transfer may touch
    state: TransferState = TransferState.IN_FLIGHT
    deadline: float | None = None  # monotonic seconds; set when the transfer failed
    probe: DrainProbe | None = None
    failed_at: float | None = None
    owner: str | None = None  # the namespace owner whose KV the pages carry (None: unknown)
    notes: dict[str, object] = field(default_factory=dict)


class PageQuarantine:
    """Which pages a transfer may touch, and the frees held back until it has let go of them."""

    def __init__(self, drain_timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if drain_timeout_s <= 0:
            raise ValueError(f"drain_timeout_s must be > 0, got {drain_timeout_s!r}")
        self.drain_timeout_s = drain_timeout_s
        self.clock = clock
        self._transfers: dict[str, _Transfer] = {}
        self._fences: dict[int, int] = {}  # page -> number of transfers fencing it
        self._held: set[int] = set()  # pages freed by their owner while fenced
        self.fenced_transfers = 0  # transfers ever fenced
        self.succeeded_transfers = 0
        self.failed_transfers = 0
        self.drained_transfers = 0  # failed ones whose drain was confirmed
        self.timed_out_transfers = 0  # failed ones still undrained at their deadline
        self.released_pages = 0  # held pages handed back for (scrubbed) reuse
        self.reclaimed_pages = 0  # of those, handed back by an operator's reclaim

    # ------------------------------------------------------------------ transfer events
    def fence(self, key: str, pages: Iterable[int], owner: str | None = None) -> None:
        """Pages ``key`` may read or write from now on (called once per chunk; pages accumulate); ``owner``: whose
        KV they carry (:meth:`owner_pages`)."""
        transfer = self._transfers.get(key)
        if transfer is None:
            transfer = self._transfers[key] = _Transfer(set(), owner=owner)
            self.fenced_transfers += 1
        new = {int(p) for p in pages} - transfer.pages
        transfer.pages |= new
        for page in new:
            self._fences[page] = self._fences.get(page, 0) + 1

    def succeeded(self, key: str) -> list[int]:
        """``key`` finished and the engine is done with its pages; returns held pages to free now."""
        transfer = self._transfers.pop(key, None)
        if transfer is None:
            return []
        self.succeeded_transfers += 1
        return self._unfence(transfer)

    def failed(self, key: str, probe: DrainProbe | None) -> list[int]:
        """``key`` failed or was aborted; its pages stay held until ``probe()`` is True.

        Returns pages to free now (when the probe already says drained).
        """
        transfer = self._transfers.get(key)
        if transfer is None or transfer.state is not TransferState.IN_FLIGHT:
            return []
        self.failed_transfers += 1
        transfer.state = TransferState.DRAINING
        transfer.failed_at = self.clock()
        transfer.deadline = transfer.failed_at + self.drain_timeout_s
        transfer.probe = probe
        return self.poll()

    def poll(self) -> list[int]:
        """Check failed transfers: drained ones let go of their pages (returned); overdue ones time out."""
        out: list[int] = []
        now = self.clock()
        for key, transfer in list(self._transfers.items()):
            if transfer.state is TransferState.IN_FLIGHT:
                continue
            if _drained(transfer.probe):
                del self._transfers[key]
                self.drained_transfers += 1
                out += self._unfence(transfer)
            elif (
                transfer.state is TransferState.DRAINING and transfer.deadline is not None and now >= transfer.deadline
            ):
                transfer.state = TransferState.TIMED_OUT
                self.timed_out_transfers += 1
                logger.error(
                    "sglang-iso: transfer %s not drained %.0fs after it failed; its %d pages stay quarantined",
                    key, self.drain_timeout_s, len(transfer.pages),
                )  # fmt: skip
        return out

    def reclaim_timed_out(self) -> list[int]:
        """Operator decision (the peer is known gone): let go of every timed-out transfer's pages."""
        out: list[int] = []
        for key, transfer in list(self._transfers.items()):
            if transfer.state is TransferState.TIMED_OUT:
                del self._transfers[key]
                pages = self._unfence(transfer)
                self.reclaimed_pages += len(pages)
                out += pages
        return out

    # ------------------------------------------------------------------ the allocator's free path
    def divert(self, pages: Iterable[int]) -> list[int]:
        """Split a free: fenced pages are held back; returns the pages to free now."""
        now: list[int] = []
        for page in pages:
            p = int(page)
            if p in self._fences:
                self._held.add(p)
            else:
                now.append(p)
        return now

    def fenced_pages(self) -> set[int]:
        """Every page some transfer may still touch (the allocator must not hand these out)."""
        return set(self._fences)

    def in_flight(self, key: str) -> bool:
        """True while ``key`` is fenced and has neither succeeded nor failed."""
        transfer = self._transfers.get(key)
        return transfer is not None and transfer.state is TransferState.IN_FLIGHT

    def pages_of(self, key: str) -> frozenset[int] | None:
        """The pages ``key`` still fences, or None once it let go of them."""
        transfer = self._transfers.get(key)
        return None if transfer is None else frozenset(transfer.pages)

    def owner_pages(self, owner: str) -> int:
        """Pages fenced by ``owner``'s transfers (``"*"``: by any transfer): KV of the owner no erase can scrub
        until the transfer lets go (then the allocator's release path zeroes them)."""
        pages = {p for t in self._transfers.values() if owner in ("*", t.owner) for p in t.pages}
        return len(pages)

    def held_count(self) -> int:
        """Pages freed by their owner and held back (not in the allocator's free list)."""
        return len(self._held)

    def hold_all_fenced(self) -> None:
        """The pool was cleared (every page freed at once): fenced pages count as freed and stay held."""
        self._held |= set(self._fences)

    # ------------------------------------------------------------------ reporting
    def status(self) -> dict[str, int]:
        by_state = {s: 0 for s in TransferState}
        pages_by_state = {s: 0 for s in TransferState}
        for transfer in self._transfers.values():
            by_state[transfer.state] += 1
            pages_by_state[transfer.state] += len(transfer.pages)
        return {
            "transfers_in_flight": by_state[TransferState.IN_FLIGHT],
            "transfers_draining": by_state[TransferState.DRAINING],
            "transfers_timed_out": by_state[TransferState.TIMED_OUT],
            "fenced_pages": len(self._fences),
            "quarantined_pages": len(self._held),
            "timed_out_pages": pages_by_state[TransferState.TIMED_OUT],
            "fenced_transfers_total": self.fenced_transfers,
            "succeeded_transfers_total": self.succeeded_transfers,
            "failed_transfers_total": self.failed_transfers,
            "drained_transfers_total": self.drained_transfers,
            "timed_out_transfers_total": self.timed_out_transfers,
            "released_pages_total": self.released_pages,
            "reclaimed_pages_total": self.reclaimed_pages,
        }

    def check_integrity(self) -> None:
        """Fence counts equal the transfers' page sets; held pages are all fenced."""
        counts: dict[int, int] = {}
        for transfer in self._transfers.values():
            for page in transfer.pages:
                counts[page] = counts.get(page, 0) + 1
        assert counts == self._fences, f"{counts=} {self._fences=}"
        assert self._held <= set(self._fences), f"{self._held - set(self._fences)=}"

    def _unfence(self, transfer: _Transfer) -> list[int]:
        out = []
        for page in transfer.pages:
            left = self._fences[page] - 1
            if left:
                self._fences[page] = left
                continue
            del self._fences[page]
            if page in self._held:
                self._held.discard(page)
                out.append(page)
        self.released_pages += len(out)
        return sorted(out)


def _drained(probe: DrainProbe | None) -> bool:
    if probe is None:
        return False
    try:
        return probe() is True
    except Exception:  # NOTE: a failing probe proves nothing: keep the pages (fail closed)
        logger.exception("sglang-iso: drain probe failed; pages stay quarantined")
        return False
