"""How long a tenant's cached KV may live: per-owner retention, decided in the HTTP process.

Two limits per namespace owner (a tenant, or a group: the strictest of its members), from the tenants file:

    cache_ttl_seconds      idle retention: no request of the owner in flight and none finished for this long
                           -> every copy of the owner's cache is dropped (device, host tier, L3: scrubbed)
    cache_max_age_seconds  absolute lifetime: at most this long after the owner's first use since its last
                           drop, the owner's cache is dropped, whatever its traffic

A client may shorten, never extend, its own retention: a request with ``X-Cache-TTL-Seconds: N`` makes the owner's
idle retention at most N seconds until the owner's cache is next dropped (:meth:`Retention.shorten`); a value above
the configured limit changes nothing. The owner is the namespace owner, so a group member shortens its group's.

The drop is the tenant erase (as ``POST /iso/tenants/{id}/erase``, with a receipt), sent to every scheduler by
the sweeper (:mod:`sglang_iso.integration.front.sweeper`), so every rank drops at the same point of its loop.
Entries a running request holds are kept until it ends (they are locked); the next drop after it takes them. Pure
bookkeeping, driven by a monotonic clock; not thread-safe (the HTTP process's event loop).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sglang_iso.tenancy.config import TenantsConfig

IDLE = "idle"
MAX_AGE = "max_age"


@dataclass(frozen=True)
class Policy:
    """One owner's retention limits, in seconds (None: no limit)."""

    ttl_s: int | None = None
    max_age_s: int | None = None


def policies(config: TenantsConfig) -> dict[str, Policy]:
    """Owner -> its limits, for owners that have any (a group: the smallest of its members' and defaults)."""
    out: dict[str, Policy] = {}
    for tenant in config.tenants.values():
        owner = tenant.group or tenant.id
        ttl = tenant.cache_ttl_seconds or config.default_cache_ttl_seconds
        age = tenant.cache_max_age_seconds or config.default_cache_max_age_seconds
        had = out.get(owner, Policy())
        policy = Policy(_smallest(had.ttl_s, ttl), _smallest(had.max_age_s, age))
        if policy != Policy():
            out[owner] = policy
    return out


def _smallest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class _Activity:
    __slots__ = ("first_use", "in_flight", "last_done")

    def __init__(self) -> None:
        self.in_flight = 0
        self.first_use: float | None = None  # first request since the last drop; None: nothing cached since
        self.last_done = 0.0


class Retention:
    """Tracks each owner's requests and says which owners' caches are due to be dropped."""

    def __init__(self, limits: Mapping[str, Policy], clock: Callable[[], float] = time.monotonic) -> None:
        self.limits: Mapping[str, Policy] = dict(limits)
        self._clock = clock
        self._activity: dict[str, _Activity] = {}
        self.expired: dict[str, dict[str, int]] = {}
        """Owner -> drops done, by reason (``idle``, ``max_age``)."""
        self._asked: dict[str, int] = {}  # owner -> the shortest idle retention its requests asked for since a drop
        self._seed()

    def replace_limits(self, limits: Mapping[str, Policy]) -> None:
        """A reloaded tenants file: new limits, the activity seen so far kept."""
        self.limits = dict(limits)
        self._seed()

    def _seed(self) -> None:
        """Owners with limits not seen yet count as used now: what a tier kept from before (L3 files across a
        restart) is dropped one limit after the start, even if the owner never returns."""
        now = self._clock()
        for owner in self.limits:
            if owner not in self._activity:
                act = self._activity[owner] = _Activity()
                act.first_use = act.last_done = now

    def tracks(self, owner: str) -> bool:
        """Whether ``owner``'s requests are tracked: it has a limit, configured or asked for."""
        return owner in self.limits or owner in self._asked

    def shorten(self, owner: str, ttl_s: int) -> None:
        """A request of ``owner`` asked for an idle retention of at most ``ttl_s`` seconds (> 0): it applies until
        the owner's cache is next dropped; a longer one than the limit in force changes nothing.

        Mutates: the owner's asked limit (only ever down).
        """
        had = self._asked.get(owner)
        self._asked[owner] = ttl_s if had is None else min(had, ttl_s)

    def policy(self, owner: str) -> Policy:
        """The limits in force for ``owner``: configured, with the idle limit lowered to what its requests asked."""
        policy = self.limits.get(owner, Policy())
        asked = self._asked.get(owner)
        return policy if asked is None else Policy(_smallest(policy.ttl_s, asked), policy.max_age_s)

    def started(self, owner: str) -> None:
        """A request of ``owner`` entered the cache's path."""
        if not self.tracks(owner):
            return
        act = self._activity.setdefault(owner, _Activity())
        act.in_flight += 1
        if act.first_use is None:
            act.first_use = self._clock()

    def finished(self, owner: str) -> None:
        """That request ended (served, failed or cancelled)."""
        act = self._activity.get(owner)
        if act is None or act.in_flight == 0:
            return
        act.in_flight -= 1
        act.last_done = self._clock()

    def due(self) -> list[tuple[str, str]]:
        """``(owner, reason)`` of every owner whose cache is due to be dropped now, by name."""
        now = self._clock()
        out = []
        for owner, act in sorted(self._activity.items()):
            policy = self.policy(owner)
            if act.first_use is None:
                continue
            if policy.max_age_s is not None and now - act.first_use >= policy.max_age_s:
                out.append((owner, MAX_AGE))
            elif policy.ttl_s is not None and act.in_flight == 0 and now - act.last_done >= policy.ttl_s:
                out.append((owner, IDLE))
        return out

    def dropped(self, owner: str, reason: str) -> None:
        """``owner``'s cache was dropped: its clocks restart at its next request (or now, with one running)."""
        act = self._activity.get(owner)
        if act is None:
            return
        act.first_use = self._clock() if act.in_flight else None
        self._asked.pop(owner, None)  # what was cached under the shorter limit is gone
        counts = self.expired.setdefault(owner, {IDLE: 0, MAX_AGE: 0})
        counts[reason] = counts.get(reason, 0) + 1

    def state(self, owner: str) -> dict[str, int | None]:
        """The owner's limits and drops, for ``GET /iso/tenants``."""
        policy = self.limits.get(owner, Policy())
        counts = self.expired.get(owner, {})
        return {
            "cache_ttl_seconds": policy.ttl_s,
            "cache_max_age_seconds": policy.max_age_s,
            "asked_ttl_seconds": self._asked.get(owner),
            "expired_idle": counts.get(IDLE, 0),
            "expired_max_age": counts.get(MAX_AGE, 0),
        }

    def next_check_s(self) -> float:
        """How long the sweeper may sleep: a tenth of the shortest limit, between 0.1 s and 1 s."""
        limits = [s for p in self.limits.values() for s in (p.ttl_s, p.max_age_s) if s is not None]
        limits += self._asked.values()
        return min(1.0, max(0.1, min(limits, default=10) / 10))
