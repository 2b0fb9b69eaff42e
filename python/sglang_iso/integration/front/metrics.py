"""Per-tenant served-token counts, metrics and audit records, from each request's final outputs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sglang_iso import observability


def enabled() -> bool:
    """True when metrics or the audit log are on (otherwise outputs are not observed at all)."""
    return observability.metrics() is not None or observability.audit_logger() is not None


def init_tenant_series(tenant_ids: list[str]) -> None:
    """Make every tenant's token-counter series at 0 before its first request.

    NOTE: a series first scraped with all of a burst already counted shows no increase to ``rate()``; series that
    exist at 0 from the start (and for tenants added by a reload) do.
    """
    m = observability.metrics()
    if m is None:
        return
    for tenant in tenant_ids:
        m["prompt_tokens"].labels(tenant=tenant)
        m["cached_tokens"].labels(tenant=tenant)


def short_namespace(tag: Any) -> str | None:
    """``iso1.<owner>.<namespace id>.<mac>``: the first 12 hex chars of the id identify it in logs."""
    parts = tag.split(".") if isinstance(tag, str) else []
    return parts[2][:12] if len(parts) == 4 else None


async def observe(
    outputs: Any, tenant: str, namespace: str | None, served: dict[str, dict[str, int]] | None = None
) -> AsyncIterator[Any]:
    """Pass ``outputs`` through; record each finished request's token counts for ``tenant``.

    ``served`` (tenant -> ``requests``, ``prompt_tokens``, ``cached_tokens``) is incremented with what the client
    was served: the numbers ``GET /iso/tenants`` reports beside the tree's lookup counters.
    """
    async for out in outputs:
        for item in out if isinstance(out, list) else [out]:
            meta = item.get("meta_info") if isinstance(item, dict) else None
            if isinstance(meta, dict) and meta.get("finish_reason") is not None:
                _record(tenant, namespace, meta, served)
        yield out


def _record(tenant: str, namespace: str | None, meta: dict[str, Any], served: dict[str, dict[str, int]] | None) -> None:
    prompt_tokens = int(meta.get("prompt_tokens") or 0)
    cached = int(meta.get("cached_tokens") or 0)
    if served is not None:
        row = served.setdefault(tenant, {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0})
        row["requests"] += 1
        row["prompt_tokens"] += prompt_tokens
        row["cached_tokens"] += cached
    if not enabled():
        return
    m = observability.metrics()
    if m is not None:
        m["prompt_tokens"].labels(tenant=tenant).inc(prompt_tokens)
        m["cached_tokens"].labels(tenant=tenant).inc(cached)
    if cached > 0:
        observability.audit(
            "cache_hit", tenant=tenant, namespace=namespace, hit_tokens=cached,
            prompt_tokens=prompt_tokens, rid=meta.get("id"),
        )  # fmt: skip
