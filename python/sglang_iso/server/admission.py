"""Per-tenant admission: how many requests one tenant may have in flight at once, and how many may wait.

The gate takes a slot before it hands a tenant's request to SGLang and gives it
back when the response has been sent (or the client went away). A tenant at its
limit waits in its own queue at the gate, first come first served, when it has
room there (``max_queued_requests``, default 0); otherwise it gets 429 with
``Retry-After``. So one tenant's flood cannot fill the server's running slots
and waiting queue while another tenant's first request waits behind it. The
limits are per tenant (``max_concurrent_requests`` in the tenants file); tenants
without one get ``default_limit``.

Single event loop: the counters are touched only from the HTTP server's loop, so
no lock is needed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

DEFAULT_MAX_CONCURRENT = 32
"""Per-tenant limit when neither the tenant nor ``--max-running-requests`` gives one."""
RETRY_AFTER_S = 1
"""What a refused tenant is told to wait (seconds)."""
QUEUE_WAIT_S = 300.0
"""Longest a queued request waits for a slot before it is refused (429); a client that leaves earlier leaves the
queue at once."""


def default_limit(max_running_requests: int | None) -> int:
    """Half the server's running slots (at least 1), so one tenant never holds them all; else a fixed default."""
    if max_running_requests is None or max_running_requests <= 0:
        return DEFAULT_MAX_CONCURRENT
    return max(1, max_running_requests // 2)


class Admission:
    """In-flight request counts per tenant, with a limit and a queue size looked up per tenant.

    ``limit_of(tenant)`` returns the tenant's own limit or None for the default; ``queue_of(tenant)`` how many of
    its requests may wait for a slot. Both are consulted on every request, so a reloaded tenants file takes effect
    for the next request. ``in_flight`` counts slots held (a slot handed to a waiter stays counted).
    """

    def __init__(
        self, limit_of: Callable[[str], int | None], default: int, queue_of: Callable[[str], int] | None = None
    ) -> None:
        self._limit_of = limit_of
        self._queue_of = queue_of
        self.default = default
        self.in_flight: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        """Tenant -> its queued requests' futures, oldest first; a future's result is a slot handed over."""

    def limit(self, tenant: str) -> int:
        own = self._limit_of(tenant)
        return own if own is not None else self.default

    def queue_limit(self, tenant: str) -> int:
        return self._queue_of(tenant) if self._queue_of is not None else 0

    def queued(self, tenant: str) -> int:
        return len(self.waiting.get(tenant, ()))

    def try_acquire(self, tenant: str) -> bool:
        """Take a slot for ``tenant`` without waiting; False (and counted) when it is at its limit."""
        if self._take(tenant):
            return True
        self.refused[tenant] = self.refused.get(tenant, 0) + 1
        return False

    async def acquire(
        self, tenant: str, gone: Callable[[], Awaitable[object]], max_wait_s: float = QUEUE_WAIT_S
    ) -> bool:
        """Take a slot, waiting in ``tenant``'s queue when it has room; False (counted) when refused or given up.

        ``gone`` returns when the client disconnects (the ASGI ``receive`` after the body): a waiter whose client
        left leaves the queue.
        """
        if self._take(tenant):
            return True
        queue = self.waiting.setdefault(tenant, deque())
        if len(queue) >= self.queue_limit(tenant):
            self._drop_empty(tenant)
            self.refused[tenant] = self.refused.get(tenant, 0) + 1
            return False
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(slot)
        left: asyncio.Future[Any] = asyncio.ensure_future(gone())
        both: set[asyncio.Future[Any]] = {slot, left}
        try:
            await asyncio.wait(both, timeout=max_wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
            if not slot.done():
                slot.cancel()
            if slot in queue:
                queue.remove(slot)
            self._drop_empty(tenant)
        if slot.cancelled() or slot.exception() is not None:
            self.refused[tenant] = self.refused.get(tenant, 0) + 1
            return False
        if left.done() and not left.cancelled():  # the slot came, but the client had left: pass it on
            self.release(tenant)
            return False
        return True

    def release(self, tenant: str) -> None:
        """Give a slot back: to ``tenant``'s oldest waiter when one waits (and the limit allows), else free it."""
        queue = self.waiting.get(tenant)
        current = self.in_flight.get(tenant, 0)
        if queue and current <= self.limit(tenant):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the slot changes hands: in_flight stays
                    self._drop_empty(tenant)
                    return
        self._drop_empty(tenant)
        if current <= 1:
            self.in_flight.pop(tenant, None)
        else:
            self.in_flight[tenant] = current - 1

    def _take(self, tenant: str) -> bool:
        """A free slot for a newcomer: under the limit and nobody of this tenant queued before it."""
        current = self.in_flight.get(tenant, 0)
        if current >= self.limit(tenant) or self.waiting.get(tenant):
            return False
        self.in_flight[tenant] = current + 1
        return True

    def _drop_empty(self, tenant: str) -> None:
        if not self.waiting.get(tenant, True):
            self.waiting.pop(tenant, None)
