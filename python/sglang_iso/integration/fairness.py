"""Fair order across tenants in the scheduler's waiting queue.

SGLang orders the waiting queue by its schedule policy (FCFS, longest prefix
match, ...) and admits requests from the front while slots and tokens last, so
a tenant with many queued requests goes ahead of another tenant's first one.
After SGLang's own ordering (AFTER ``SchedulePolicy.calc_priority``), the queue
is interleaved by tenant: round ``k`` takes each tenant's ``k``-th request in
SGLang's order, and within a round tenants with fewer running requests come
first. Within one tenant SGLang's order (and so its cache-aware choices) is kept.

A request's tenant is the owner field of its namespace tag (``iso1.<owner>...``),
written by the front end; requests without a tag form one group of their own.
The tag is not verified here: ordering is not a security decision, and the tree
cache verifies the tag before any cache read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_UNTAGGED = ""


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
