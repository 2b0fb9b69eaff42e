"""Waiting-queue interleaving by tenant (the scheduler hook's pure part)."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_iso.integration.fairness import interleave, owner_of, reorder_waiting_queue, running_counts


def req(owner: str | None, n: int) -> SimpleNamespace:
    key = None if owner is None else f"iso1.{owner}.{'a' * 64}.{'b' * 64}"
    return SimpleNamespace(extra_key=key, n=n)


def test_a_flooding_tenant_does_not_go_ahead_of_anothers_first_request() -> None:
    queue = [req("beta", i) for i in range(48)] + [req("alpha", 0)]
    reorder_waiting_queue(None, None, queue, SimpleNamespace(reqs=[req("beta", 99)] * 8))
    assert owner_of(queue[0]) == "alpha"  # beta already runs 8, alpha none
    assert [r.n for r in queue if owner_of(r) == "beta"] == list(range(48))  # beta's own order kept


def test_round_robin_and_order_within_a_tenant() -> None:
    queue = [req("b", 0), req("b", 1), req("a", 0), req("b", 2), req("a", 1), req(None, 0)]
    out = interleave(queue, owner_of, {})
    assert [(owner_of(r), r.n) for r in out] == [("b", 0), ("a", 0), ("", 0), ("b", 1), ("a", 1), ("b", 2)]


def test_single_tenant_queue_is_untouched() -> None:
    queue = [req("a", i) for i in (3, 1, 2)]
    assert interleave(queue, owner_of, {"a": 5}) == queue
    assert running_counts(queue) == {"a": 3}
