"""``GET /iso/tenants``, ``POST /iso/flush``, ``POST /iso/tenants/{id}/erase`` (with a receipt), ``GET /iso/check``,
``GET /iso/pd`` (PD transfer quarantine) and ``POST /iso/pd/reclaim``.

Admin-only: the gate lets only admins reach /iso/*.
"""

from __future__ import annotations

from typing import Any

from sglang_iso import observability
from sglang_iso.integration.front import sweeper
from sglang_iso.integration.front.state import FrontState


def add_iso_routes(app: Any, tokenizer_manager: Any, front: FrontState) -> None:
    """Add the /iso/* routes to SGLang's FastAPI ``app``; they read ``front.config`` at each call."""
    from fastapi.responses import ORJSONResponse

    from sglang_iso.integration import commands
    from sglang_iso.integration.cache_report import ROW_COUNTERS, SHARE_COUNTERS

    async def iso_tenants() -> Any:
        config = front.config
        states = await tokenizer_manager.get_internal_state()
        states = sorted(states, key=lambda s: s.get("sglang_iso", {}).get("dp_rank", 0))  # replies come unordered
        per_rank = [s.get("sglang_iso", {}).get("tenants", {}) for s in states]
        idle_row = {"namespaces": 0, **dict.fromkeys((*ROW_COUNTERS, *SHARE_COUNTERS), 0)}
        tenants: dict[str, Any] = {}
        for tenant in config.tenants.values():
            owner = tenant.group or tenant.id
            tenants[tenant.id] = {
                "cache": tenant.cache_policy if tenant.group is None else f"group:{tenant.group}",
                "quota_tokens": tenant.quota_tokens,
                "host_quota_tokens": tenant.host_quota_tokens,
                "l3_quota_tokens": tenant.l3_quota_tokens,
                "kv_share": config.kv_share_of(owner),
                "served": dict(front.served.get(tenant.id, {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0})),
                "limits": {
                    "max_concurrent_requests": tenant.max_concurrent_requests,
                    "max_queued_requests": tenant.max_queued_requests,
                    "requests_per_minute": tenant.requests_per_minute,
                    "tokens_per_minute": tenant.tokens_per_minute,
                    **(front.rates.state(tenant.id) if front.rates is not None else {}),
                    "rate_limited": front.rates.refused.get(tenant.id, 0) if front.rates is not None else 0,
                },
                "retention": front.retention.state(owner),
                # NOTE: a rank that has seen nothing of the owner reports no row: it gets the counters, all 0.
                "ranks": [rank.get(owner) or idle_row for rank in per_rank],
            }
        # Tags the scheduler could not verify (forged or malformed): isolation violations of no known tenant.
        unverified = [s.get("sglang_iso", {}).get("tree_cache", {}).get("rejected_tags", 0) for s in states]
        return ORJSONResponse({"tenants": tenants, "unverified_tags": unverified})

    def unknown_tenant(tenant_id: object, status: int = 400) -> Any:
        return ORJSONResponse(
            {
                "error": {
                    "message": f"unknown tenant {tenant_id!r}",
                    "type": "invalid_request_error",
                    "param": "tenant",
                    "code": "unknown_tenant",
                }
            },
            status_code=status,
        )

    async def iso_flush(body: dict[str, Any]) -> Any:
        config = front.config
        tenant_id = body.get("tenant") if isinstance(body, dict) else None
        tenant = config.tenants.get(tenant_id) if isinstance(tenant_id, str) else None
        if tenant is None:
            return unknown_tenant(tenant_id)
        owner = tenant.group or tenant.id
        results = await commands.send(tokenizer_manager, commands.flush(owner))
        ok = bool(results) and all(results)
        return ORJSONResponse(
            {"flushed": ok, "tenant": tenant.id, "namespace_owner": owner}, status_code=200 if ok else 500
        )

    async def iso_erase(tenant_id: str) -> Any:
        tenant = front.config.tenants.get(tenant_id)
        if tenant is None:
            return unknown_tenant(tenant_id, 404)
        receipt = await sweeper.erase(tokenizer_manager, tenant.group or tenant.id, tenant.id)
        observability.audit("tenant_erased", **receipt)
        return ORJSONResponse(receipt, status_code=200 if receipt["erased"] else 500)

    async def iso_check() -> Any:
        results = await commands.send(tokenizer_manager, commands.CHECK_INTEGRITY)
        ok = bool(results) and all(results)
        return ORJSONResponse({"integrity_ok": ok}, status_code=200 if ok else 500)

    async def iso_pd(command: commands.Command) -> Any:
        results = await commands.send(tokenizer_manager, command)
        states = await tokenizer_manager.get_internal_state()
        pd = [s.get("sglang_iso", {}).get("pd") for s in states]
        ok = bool(results) and all(results)
        return ORJSONResponse({"ok": ok, "pd": pd}, status_code=200 if ok else 409)

    async def iso_pd_status() -> Any:
        return await iso_pd(commands.PD_STATUS)

    async def iso_pd_reclaim() -> Any:
        return await iso_pd(commands.PD_RECLAIM)

    app.add_api_route("/iso/pd", iso_pd_status, methods=["GET"])
    app.add_api_route("/iso/pd/reclaim", iso_pd_reclaim, methods=["POST"])
    app.add_api_route("/iso/check", iso_check, methods=["GET"])
    app.add_api_route("/iso/tenants", iso_tenants, methods=["GET"])
    app.add_api_route("/iso/flush", iso_flush, methods=["POST"])
    app.add_api_route("/iso/tenants/{tenant_id}/erase", iso_erase, methods=["POST"])
