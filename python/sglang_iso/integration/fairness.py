"""Fairness across tenants in the scheduler: queue order, a share of the KV pool each, retraction order.

SGLang orders the waiting queue by its schedule policy (FCFS, longest prefix
match, ...) and admits requests from the front while slots and tokens last, so
a tenant with many queued requests goes ahead of another tenant's first one.
After SGLang's own ordering (AFTER ``SchedulePolicy.calc_priority``), the queue
is interleaved by tenant: round ``k`` takes each tenant's ``k``-th request in
SGLang's order, and within a round tenants with fewer running requests come
first. Within one tenant SGLang's order (and so its cache-aware choices) is kept.

Order alone does not stop one tenant from holding the pool: SGLang reserves KV for
each running request's whole remaining output, so a tenant's long streams keep every
other tenant's prefill waiting. So each owner (tenant or group) may hold at most its
KV share (``kv_share`` in the tenants file) of the pool and of the running batch,
counted as prompt + ``max_new_tokens`` over its running and newly admitted requests
(:func:`hold_back`): before each prefill pass, the requests that would go over their
owner's share sit out that pass (AROUND ``Scheduler._get_new_batch_prefill_raw``);
an owner with nothing running always gets one request, however large. When decode
memory runs short anyway (shares may add up to more than 1), SGLang retracts from
the end of its order; requests of owners over their share are moved there, so they go
first, never a request of an owner within its share while one over it is running
(AROUND ``ScheduleBatch.retract_decode``, AFTER its ``_get_decode_retraction_order``).

A request's tenant is the owner field of its namespace tag (``iso1.<owner>...``),
written by the front end; requests without a tag form one group of their own.
The tag is not verified here: ordering is not a security decision, and the tree
cache verifies the tag before any cache read.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

_UNTAGGED = ""

logger = logging.getLogger(__name__)


@dataclass
class KvShares:
    """One scheduler's per-owner shares and what enforcing them did. Lives on the tenant cache (``kv_shares``).

    Mutated only by the scheduler thread (the hooks of this module).
    """

    share_of: Callable[[str], float]
    """Owner (tenant id or group) -> its share of the KV pool and of the running batch, in (0, 1]."""
    held_back: dict[str, int] = field(default_factory=dict)
    """Owner -> requests that sat out at least one prefill pass for its share (each request counted once)."""
    retracted_first: dict[str, int] = field(default_factory=dict)
    """Owner -> its requests moved to the front of a decode retraction for being over its share."""
    _seen: set[str] = field(default_factory=set)
    """Request ids already counted in ``held_back`` and still waiting (bounded by the waiting queue)."""

    def budget(self, owner: str, total: int) -> int:
        """The owner's share of ``total`` (tokens or running slots), at least 1."""
        return max(1, int(self.share_of(owner) * total))

    def status(self) -> dict[str, dict[str, int]]:
        return {"held_back": dict(self.held_back), "retracted_first": dict(self.retracted_first)}


def held_tokens(req: Any) -> int:
    """Upper bound of the KV tokens a request may hold: its prompt plus its whole output budget."""
    prompt = len(getattr(req, "origin_input_ids", None) or ())
    params = getattr(req, "sampling_params", None)
    budget = getattr(params, "max_new_tokens", None)
    return prompt + (budget if isinstance(budget, int) and budget > 0 else 0)


def hold_back(
    queue: Sequence[T],
    running: Iterable[Any],
    owner: Callable[[Any], str],
    tokens_budget: Callable[[str], int],
    slots_budget: Callable[[str], int],
) -> tuple[list[T], list[T]]:
    """Split ``queue`` into the requests that fit their owner's budgets (in order) and those held back.

    An owner's usage starts from its ``running`` requests and grows with each admitted
    one; an owner with no usage yet always gets its first request. Untagged requests are
    never held back (the tree cache gives them no sharing; SGLang's own limits apply).
    """
    tokens: dict[str, int] = {}
    slots: dict[str, int] = {}
    for req in running:
        o = owner(req)
        tokens[o] = tokens.get(o, 0) + held_tokens(req)
        slots[o] = slots.get(o, 0) + 1
    admit: list[T] = []
    held: list[T] = []
    for req in queue:
        o = owner(req)
        cost = held_tokens(req)
        used, count = tokens.get(o, 0), slots.get(o, 0)
        if o == _UNTAGGED or count == 0 or (used + cost <= tokens_budget(o) and count + 1 <= slots_budget(o)):
            admit.append(req)
            tokens[o] = used + cost
            slots[o] = count + 1
        else:
            held.append(req)
    return admit, held


def over_share_last(order: list[int], reqs: Sequence[Any], shares: KvShares, pool_tokens: int) -> list[int]:
    """``order`` (most-preferred to keep first) with the requests of owners over their token share moved last."""
    used: dict[str, int] = {}
    for req in reqs:
        o = owner_of(req)
        used[o] = used.get(o, 0) + held_tokens(req)
    over = {o for o, n in used.items() if o != _UNTAGGED and n > shares.budget(o, pool_tokens)}
    if not over:
        return order
    keep = [i for i in order if owner_of(reqs[i]) not in over]
    last = [i for i in order if owner_of(reqs[i]) in over]
    for i in last:
        o = owner_of(reqs[i])
        shares.retracted_first[o] = shares.retracted_first.get(o, 0) + 1
    return keep + last


def owner_of(req: Any) -> str:
    """The tenant (or group) a request's namespace tag names; ``""`` for none."""
    key = getattr(req, "extra_key", None)
    if not isinstance(key, str) or not key.startswith("iso1."):
        return _UNTAGGED
    return key.split(".", 2)[1]


def interleave(queue: Sequence[T], owner: Any, running: dict[str, int]) -> list[T]:
    """``queue`` in round-robin order by ``owner(item)``, fewest ``running`` first within a round."""
    groups: dict[str, list[T]] = {}
    for item in queue:
        groups.setdefault(owner(item), []).append(item)
    if len(groups) <= 1:
        return list(queue)
    order = sorted(groups, key=lambda o: running.get(o, 0))  # stable: first-seen order breaks ties
    out: list[T] = []
    for k in range(max(len(g) for g in groups.values())):
        out.extend(groups[o][k] for o in order if k < len(groups[o]))
    return out


def running_counts(reqs: Iterable[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for req in reqs:
        o = owner_of(req)
        counts[o] = counts.get(o, 0) + 1
    return counts


def reorder_waiting_queue(
    _result: Any, _policy: Any, waiting_queue: list[Any], running_batch: Any = None, *_args: Any, **_kwargs: Any
) -> None:
    """AFTER ``SchedulePolicy.calc_priority``: interleave ``waiting_queue`` by tenant, in place."""
    if len(waiting_queue) < 2:
        return
    running = running_counts(getattr(running_batch, "reqs", None) or ())
    waiting_queue[:] = interleave(waiting_queue, owner_of, running)


def admit_within_share(original: Callable[..., Any], scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``Scheduler._get_new_batch_prefill_raw``: requests over their owner's share sit out this pass.

    They leave ``scheduler.waiting_queue`` for the call and are appended back after it, in order
    (the next ``calc_priority`` orders the queue again).
    """
    queue = getattr(scheduler, "waiting_queue", None)
    if not queue:
        return original(scheduler, *args, **kwargs)  # (nearly every decode step: nothing waits)
    shares: KvShares | None = getattr(getattr(scheduler, "tree_cache", None), "kv_shares", None)
    running_batch = kwargs.get("running_batch", args[1] if len(args) > 1 else None)
    pool, slots = getattr(scheduler, "max_total_num_tokens", None), getattr(scheduler, "max_running_requests", None)
    if shares is None or not isinstance(pool, int) or not isinstance(slots, int):
        return original(scheduler, *args, **kwargs)
    running = list(getattr(running_batch, "reqs", None) or ())
    chunked = getattr(scheduler, "chunked_req", None)
    if chunked is not None:
        running.append(chunked)
    admit, held = hold_back(
        queue, running, owner_of, lambda o: shares.budget(o, pool), lambda o: shares.budget(o, slots)
    )
    if not held:
        return original(scheduler, *args, **kwargs)
    for req in held:
        rid = getattr(req, "rid", None)
        if isinstance(rid, str) and rid not in shares._seen:
            shares._seen.add(rid)
            o = owner_of(req)
            shares.held_back[o] = shares.held_back.get(o, 0) + 1
    queue[:] = admit
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        # NOTE: SGLang rebinds waiting_queue to a new list when it admits requests; append to the live one.
        scheduler.waiting_queue.extend(held)
        waiting = {getattr(r, "rid", None) for r in held}
        shares._seen.intersection_update(waiting)


_RETRACTING: contextvars.ContextVar[tuple[KvShares, int] | None] = contextvars.ContextVar(
    "sglang_iso_retracting", default=None
)
"""The shares and pool size of the batch being retracted, for the order hook below (set only during the call)."""


def retract_with_shares(original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``ScheduleBatch.retract_decode``: make the batch's shares visible to the retraction order."""
    shares = getattr(getattr(batch, "tree_cache", None), "kv_shares", None)
    allocator = getattr(batch, "token_to_kv_pool_allocator", None)
    pool = getattr(allocator, "size", None)
    if not isinstance(shares, KvShares) or not isinstance(pool, int):
        return original(batch, *args, **kwargs)
    token = _RETRACTING.set((shares, pool))
    try:
        return original(batch, *args, **kwargs)
    finally:
        _RETRACTING.reset(token)


def retraction_order(result: list[int], reqs: Sequence[Any], *_args: Any, **_kwargs: Any) -> list[int] | None:
    """AFTER ``ScheduleBatch._get_decode_retraction_order``: owners over their share are retracted first."""
    current = _RETRACTING.get()
    if current is None or not isinstance(result, list):
        return None
    shares, pool = current
    return over_share_last(result, reqs, shares, pool)
