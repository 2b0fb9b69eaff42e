"""Tokenizer-manager hook: pin each tenant's requests to one stable DP rank (``--dp-size`` > 1).

SGLang's DP controller sends a request with ``routed_dp_rank`` set to that rank
under every load-balance method. Clients may not set the field (the gate refuses
it); here it is overwritten with the rank of the request's namespace owner (the
tenant, or its cache group), or cleared for a request without an authenticated
tenant, which then goes wherever the load balancer puts it (it never shares).

A rank that fails: a scheduler process that dies takes the whole server down
(SGLang's launcher watches its children), so no request is silently sent to a
half-dead rank and no rank ever serves another rank's tree. Routing never
affects isolation; a tenant moved to another rank only loses its cache.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_iso.server.dp import tenant_rank
from sglang_iso.settings import current as current_settings

logger = logging.getLogger(__name__)


def route_to_tenant_rank(manager: Any, obj: Any, request: Any = None, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``TokenizerManager.generate_request``: set ``obj.routed_dp_rank`` from the tenant."""

    dp_size = int(getattr(getattr(manager, "server_args", None), "dp_size", 1) or 1)
    if dp_size <= 1 or current_settings().tenants_file is None or not hasattr(obj, "routed_dp_rank"):
        return
    from sglang_iso.server.gate import STATE_TENANT

    request = kwargs.get("request", request)
    tenant = getattr(getattr(request, "state", None), STATE_TENANT, None) if request is not None else None
    obj.routed_dp_rank = tenant_rank(_owner_of(tenant), dp_size) if isinstance(tenant, str) else None


def _owner_of(tenant: str) -> str:
    """The tenant's namespace owner in the tenants config in force (a SIGHUP reload moves a tenant that joins or
    leaves a group to the group's rank or its own); its id when the gate is not installed or it is unknown."""
    from sglang_iso.integration.front import state

    front = state.current()
    config = front.config.tenants if front is not None else {}
    entry = config.get(tenant)
    return (entry.group or entry.id) if entry is not None else tenant
