"""Waiting-queue interleaving by tenant (the scheduler hook's pure part)."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_iso.integration.fairness import (
    KvShares,
    held_tokens,
    hold_back,
    interleave,
    over_share_last,
    owner_of,
    reorder_waiting_queue,
    running_counts,
)


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


def stream(owner: str | None, rid: str, prompt: int = 100, out: int = 7000) -> SimpleNamespace:
    """A request as the KV-share hook sees it: tag, id, prompt ids and output budget."""
    r = req(owner, 0)
    r.rid, r.origin_input_ids, r.sampling_params = rid, [1] * prompt, SimpleNamespace(max_new_tokens=out)
    return r


def test_held_tokens_is_prompt_plus_whole_output_budget() -> None:
    assert held_tokens(stream("a", "r", 100, 7000)) == 7100
    assert held_tokens(SimpleNamespace()) == 0


def test_a_tenant_holds_at_most_its_share_and_the_other_tenant_is_admitted() -> None:
    """The flood of the starvation report: beta's long streams stop at its share, alpha's short request passes."""
    queue = [stream("beta", f"b{i}") for i in range(40)] + [stream("alpha", "a0", 4, 8)]
    admit, held = hold_back(queue, [], owner_of, lambda o: 32768, lambda o: 16)
    assert [r.rid for r in admit] == ["b0", "b1", "b2", "b3", "a0"]  # 4 x 7100 <= 32768 < 5 x 7100
    assert [r.rid for r in held] == [f"b{i}" for i in range(4, 40)]
    running = [stream("beta", f"r{i}") for i in range(4)]
    admit, held = hold_back(queue, running, owner_of, lambda o: 32768, lambda o: 16)
    assert [r.rid for r in admit] == ["a0"] and len(held) == 40


def test_a_lone_request_larger_than_the_share_still_runs_and_untagged_pass() -> None:
    queue = [stream("beta", "huge", 100, 100_000), stream("beta", "next", 10, 10), stream(None, "u", 100, 100_000)]
    admit, held = hold_back(queue, [], owner_of, lambda o: 1000, lambda o: 8)
    assert [r.rid for r in admit] == ["huge", "u"] and [r.rid for r in held] == ["next"]


def test_running_slots_are_shared_too() -> None:
    queue = [stream("beta", f"b{i}", 4, 4) for i in range(10)] + [stream("alpha", "a0", 4, 4)]
    admit, held = hold_back(queue, [], owner_of, lambda o: 10**9, lambda o: 3)
    assert [r.rid for r in admit] == ["b0", "b1", "b2", "a0"] and len(held) == 7


def test_the_owner_over_its_share_is_retracted_first() -> None:
    """SGLang pops from the end of its order: over-share owners' requests move there, SGLang's order kept."""
    reqs = [stream("alpha", "a0", 4, 8), stream("beta", "b0"), stream("alpha", "a1", 4, 8), stream("beta", "b1")]
    shares = KvShares(lambda o: 0.5)
    order = [1, 0, 3, 2]  # SGLang's: would retract alpha's a1 first
    assert over_share_last(order, reqs, shares, pool_tokens=20_000) == [0, 2, 1, 3]  # beta holds 14200 > 10000
    assert shares.retracted_first == {"beta": 2}
    assert over_share_last(order, reqs, shares, pool_tokens=40_000) == order  # nobody over: SGLang's order
