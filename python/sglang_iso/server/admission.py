"""Per-tenant admission: how many requests one tenant may have in flight at once.

The gate takes a slot before it hands a tenant's request to SGLang and gives it
back when the response has been sent (or the client went away). A tenant at its
limit gets 429 with ``Retry-After``, so one tenant's flood cannot fill the
server's running slots and waiting queue while another tenant's first request
waits behind it. The limit is per tenant (``max_concurrent_requests`` in the
tenants file); tenants without one get ``default_limit``.

Single event loop: the counters are touched only from the HTTP server's loop, so
no lock is needed.
"""

from __future__ import annotations

from collections.abc import Callable

DEFAULT_MAX_CONCURRENT = 32
"""Per-tenant limit when neither the tenant nor ``--max-running-requests`` gives one."""
RETRY_AFTER_S = 1
"""What a refused tenant is told to wait (seconds)."""


def default_limit(max_running_requests: int | None) -> int:
    """Half the server's running slots (at least 1), so one tenant never holds them all; else a fixed default."""
    if max_running_requests is None or max_running_requests <= 0:
        return DEFAULT_MAX_CONCURRENT
    return max(1, max_running_requests // 2)


class Admission:
    """In-flight request counts per tenant, with a limit looked up per tenant.

    ``limit_of(tenant)`` returns the tenant's own limit or None for the default;
    it is consulted on every request, so a reloaded tenants file takes effect for
    the next request.
    """

    def __init__(self, limit_of: Callable[[str], int | None], default: int) -> None:
        self._limit_of = limit_of
        self.default = default
        self.in_flight: dict[str, int] = {}
        self.refused: dict[str, int] = {}

    def limit(self, tenant: str) -> int:
        own = self._limit_of(tenant)
        return own if own is not None else self.default

    def try_acquire(self, tenant: str) -> bool:
        """Take a slot for ``tenant``; False (and counted) when it is at its limit."""
        current = self.in_flight.get(tenant, 0)
        if current >= self.limit(tenant):
            self.refused[tenant] = self.refused.get(tenant, 0) + 1
            return False
        self.in_flight[tenant] = current + 1
        return True

    def release(self, tenant: str) -> None:
        current = self.in_flight.get(tenant, 0)
        if current <= 1:
            self.in_flight.pop(tenant, None)
        else:
            self.in_flight[tenant] = current - 1
