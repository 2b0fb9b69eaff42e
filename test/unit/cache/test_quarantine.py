"""Pages a transfer may touch are never handed back before the transfer lets go (pure logic)."""

from __future__ import annotations

import pytest

from sglang_iso.cache.quarantine import PageQuarantine


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[PageQuarantine, Clock]:
    clock = Clock()
    return PageQuarantine(10.0, clock), clock


def test_free_while_in_flight_is_held_until_success() -> None:
    q, _ = make()
    q.fence("r1", [3, 4])
    assert q.divert([2, 3, 4]) == [2]  # 2 was never fenced
    q.check_integrity()
    assert q.status()["quarantined_pages"] == 2
    assert q.succeeded("r1") == [3, 4]
    assert q.status()["quarantined_pages"] == 0 and q.status()["released_pages_total"] == 2
    q.check_integrity()


def test_success_before_the_free_hands_back_nothing() -> None:
    q, _ = make()
    q.fence("r1", [5])
    assert q.in_flight("r1") and q.pages_of("r1") == frozenset({5})
    assert q.succeeded("r1") == []
    assert q.divert([5]) == [5]  # no longer fenced: freed as usual
    assert not q.in_flight("r1") and q.pages_of("r1") is None


def test_abort_keeps_pages_until_drained() -> None:
    q, _ = make()
    drained = {"v": False}
    q.fence("r1", [7, 8])
    assert q.failed("r1", lambda: drained["v"]) == []
    assert q.divert([7, 8]) == []
    assert q.poll() == []
    drained["v"] = True
    assert q.poll() == [7, 8]
    assert q.status()["drained_transfers_total"] == 1
    q.check_integrity()


def test_timeout_keeps_pages_quarantined_and_counts() -> None:
    q, clock = make()
    q.fence("r1", [9])
    q.failed("r1", None)  # no drain signal at all
    q.divert([9])
    clock.now = 11.0
    assert q.poll() == []
    status = q.status()
    assert status["transfers_timed_out"] == 1 and status["timed_out_transfers_total"] == 1
    assert status["quarantined_pages"] == 1 and status["timed_out_pages"] == 1
    clock.now = 1000.0
    assert q.poll() == [] and q.status()["timed_out_transfers_total"] == 1  # counted once, still held
    assert q.reclaim_timed_out() == [9]
    assert q.status()["reclaimed_pages_total"] == 1 and q.status()["quarantined_pages"] == 0


def test_late_drain_after_timeout_releases() -> None:
    q, clock = make()
    drained = {"v": False}
    q.fence("r1", [1])
    q.failed("r1", lambda: drained["v"])
    q.divert([1])
    clock.now = 20.0
    assert q.poll() == []
    drained["v"] = True
    assert q.poll() == [1]


def test_shared_page_waits_for_every_transfer() -> None:
    q, _ = make()
    q.fence("a", [1, 2])
    q.fence("b", [2, 3])
    assert q.divert([1, 2, 3]) == []
    assert q.succeeded("a") == [1]
    q.check_integrity()
    assert q.succeeded("b") == [2, 3]
    q.check_integrity()


def test_chunks_accumulate_and_a_raising_probe_keeps_pages() -> None:
    q, _ = make()
    q.fence("r", [1])
    q.fence("r", [1, 2])
    q.check_integrity()

    def boom() -> bool:
        raise RuntimeError("peer gone")

    q.failed("r", boom)
    q.divert([1, 2])
    assert q.poll() == []
    assert q.status()["fenced_pages"] == 2


def test_pool_clear_holds_fenced_pages() -> None:
    q, _ = make()
    q.fence("r", [4])
    q.hold_all_fenced()
    assert q.fenced_pages() == {4}
    assert q.succeeded("r") == [4]


def test_bad_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="drain_timeout_s"):
        PageQuarantine(0)


def test_pages_fenced_per_owner_until_the_transfer_lets_go() -> None:
    q = PageQuarantine(drain_timeout_s=5.0)
    q.fence("acme.r1@1", [3, 4], owner="acme")
    q.fence("acme.r1@1", [5])  # a later chunk of the same transfer: still acme's
    q.fence("globex.r2@2", [5, 6], owner="globex")  # page 5 fenced by both
    q.fence("x@3", [9])  # no owner known: counted only under "*"
    assert (q.owner_pages("acme"), q.owner_pages("globex"), q.owner_pages("initech")) == (3, 2, 0)
    assert q.owner_pages("*") == 5
    q.failed("acme.r1@1", lambda: False)  # failed, not drained: still fenced
    assert q.owner_pages("acme") == 3
    q.succeeded("globex.r2@2")
    assert q.owner_pages("globex") == 0 and q.owner_pages("acme") == 3
    q.failed("x@3", lambda: True)
    q.poll()
    assert q.owner_pages("*") == 3
