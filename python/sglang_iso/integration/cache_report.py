"""What the tenant cache reports: its status, per-tenant rows, Prometheus series and audit events.

Read-only over :class:`~sglang_iso.integration.tenant_cache.TenantRadixCache`
(its tree, resolver, policies and tiers); the only state kept here is what was
already exported, so counters go out as deltas. Consumers: ``/get_server_info``
(``status``), ``GET /iso/tenants`` (``tenant_stats``, one row per tenant or cache
group, tokens), ``/metrics`` and the audit log (``maybe_export``, throttled, called
from the scheduler's cache operations).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from sglang_iso import observability

ROW_COUNTERS = (
    "resident_tokens",
    "evictable_tokens",
    "protected_tokens",
    "lookup_hit_tokens",
    "lookup_tokens",
    "inserted_tokens",
    "evicted_tokens",
    "violations",
)
"""Per-owner counters of ``GET /iso/tenants`` rows, present (0) in every row."""
SHARE_COUNTERS = ("held_back_requests", "retracted_first_requests")
"""Per-owner KV-share counters, present in every row of a server with a tenants file."""

if TYPE_CHECKING:
    from sglang_iso.integration.tenant_cache import TenantRadixCache


class CacheReport:
    """Reporting for one tenant cache. Not thread-safe; call from the scheduler thread."""

    def __init__(self, cache: TenantRadixCache, backend: str) -> None:
        self.cache = cache
        self.backend = backend
        self._exported: dict[str, int] = {}
        """Counter values already exported to metrics / audit, by series name."""
        self._last_export = 0.0
        """``time.monotonic()`` of the last export."""

    @property
    def kv_pool(self) -> str | None:
        """The class name of the KV pool the cache hands out (a row of ``coverage.FAMILIES``)."""
        allocator = self.cache.token_to_kv_pool_allocator
        return None if allocator is None else type(allocator.get_kvcache()).__name__

    def status(self) -> dict[str, Any]:
        """A JSON-safe summary for /get_server_info and the startup check."""
        c = self.cache
        return {
            "backend": self.backend,
            "impl": type(c).__name__,
            "page_size": c.page_size,
            "kv_pool": self.kv_pool,
            "disabled": c.disable,
            "namespace_mode": c.resolver.mode,
            "evictable_tokens": c.evictable_size(),
            "protected_tokens": c.protected_size(),
            "violations": c.tree.violations,
            "rejected_tags": c.resolver.rejected_tags,
            "untagged_lookups": c.resolver.untagged,
            "kv_scrub": "off" if c.scrubber is None else "on-free",
            "kv_owner_check": "off" if c.page_owners is None else "on",
            "owner_violations": 0,
            **({} if c.page_owners is None else c.page_owners.status()),
            **({} if c.scrubber is None else c.scrubber.status()),
            **({} if c.host is None else c.host.status()),
        }

    def tenant_stats(self) -> dict[str, dict[str, int | None]]:
        """Per-owner totals over its namespaces (tokens), for ``GET /iso/tenants``."""
        c = self.cache
        out: dict[str, dict[str, int | None]] = {}
        for ns in c.namespaces():
            namespace = c.namespace_of(ns)
            owner = namespace.owner if namespace is not None else "open"
            st = c.tree.stats(ns)
            row = out.get(owner) or out.setdefault(owner, self._new_row(st.quota))
            row["namespaces"] = int(row["namespaces"] or 0) + 1
            for field, value in (
                ("resident_tokens", st.resident),
                ("evictable_tokens", st.evictable),
                ("protected_tokens", st.protected),
                ("lookup_hit_tokens", st.hit_tokens),
                ("lookup_tokens", st.lookup_tokens),
                ("inserted_tokens", st.inserted_tokens),
                ("evicted_tokens", st.evicted_tokens),
                ("violations", st.violations),
            ):
                row[field] = int(row[field] or 0) + int(value)
            for field, value in (c.host.ns_stats(ns) if c.host is not None else {}).items():
                row[field] = int(row[field] or 0) + value
        if c.kv_shares is not None:
            held, retracted = c.kv_shares.held_back, c.kv_shares.retracted_first
            for owner in {*out, *held, *retracted} - {"open"}:
                settings = c.policies.get(owner)
                quota = settings.quota_tokens if settings is not None else None
                # NOTE: an owner whose requests were only held back has no namespace yet; its row has every field.
                row = out.get(owner) or out.setdefault(owner, self._new_row(quota))
                row["kv_share_permille"] = round(1000 * c.kv_shares.share_of(owner))
                row["held_back_requests"] = held.get(owner, 0)
                row["retracted_first_requests"] = retracted.get(owner, 0)
        if c.host is not None:
            for owner, row in out.items():
                settings = c.policies.get(owner)
                row["host_quota_tokens"] = settings.host_quota_tokens if settings is not None else None
                if c.host.l3 is not None:
                    row.update(c.host.owner_stats(owner))
                    row["l3_quota_tokens"] = settings.l3_quota_tokens if settings is not None else None
        return out

    def _new_row(self, quota: int | None) -> dict[str, int | None]:
        """An owner's row before any namespace is added: every counter present, at 0."""
        host = self.cache.host
        return {
            "namespaces": 0,
            **dict.fromkeys(ROW_COUNTERS, 0),
            "quota_tokens_per_namespace": quota,
            **(dict.fromkeys(host.ns_stat_fields(), 0) if host is not None else {}),
        }

    def maybe_export(self, min_interval_s: float = 1.0) -> None:
        """Push per-tenant gauges and counter deltas to metrics and the audit log (throttled)."""
        c = self.cache
        now = time.monotonic()
        if now - self._last_export < min_interval_s:
            return
        self._last_export = now
        audit_log = observability.scheduler_audit_logger()  # first: this process writes PATH.scheduler
        m = observability.metrics()
        if m is None and audit_log is None:
            return
        for owner, row in self.tenant_stats().items():
            if m is not None:
                m["resident_tokens"].labels(tenant=owner).set(row["resident_tokens"] or 0)
                m["quota_tokens"].labels(tenant=owner).set(row["quota_tokens_per_namespace"] or 0)
                for tier in ("host", "l3"):
                    if f"{tier}_resident_tokens" in row:
                        m[f"{tier}_resident_tokens"].labels(tenant=owner).set(row[f"{tier}_resident_tokens"] or 0)
                        m["tier_quota_tokens"].labels(tenant=owner, tier=tier).set(row[f"{tier}_quota_tokens"] or 0)
                pruned = self._delta(f"{owner}/l3_pruned", int(row.get("l3_pruned_tokens") or 0))
                if pruned:
                    m["l3_pruned_tokens"].labels(tenant=owner).inc(pruned)
                for tier in ("host", "l3"):
                    loaded = self._delta(f"{owner}/{tier}_loaded", int(row.get(f"{tier}_loaded_tokens") or 0))
                    if loaded:
                        m["tier_loaded_tokens"].labels(tenant=owner, tier=tier).inc(loaded)
            if m is not None:
                m["violations"].labels(tenant=owner)  # the series exists at 0 before any violation (alerts)
            for field, metric in (("evicted_tokens", "evicted_tokens"), ("violations", "violations")):
                delta = self._delta(f"{owner}/{field}", int(row[field] or 0))
                if delta and m is not None:
                    m[metric].labels(tenant=owner).inc(delta)
                if delta and field == "violations":
                    observability.audit("isolation_violation", tenant=owner, count=delta)
        rejected = self._delta("unverified/violations", c.resolver.rejected_tags)
        if rejected:
            if m is not None:
                m["violations"].labels(tenant=observability.UNVERIFIED_TENANT).inc(rejected)
            observability.audit("isolation_violation", tenant=None, reason="unverified namespace tag", count=rejected)
        for owner, refused in ({} if c.page_owners is None else c.page_owners.violations_by_owner).items():
            delta = self._delta(f"{owner}/owner_violations", refused)
            if delta:
                if m is not None:
                    m["violations"].labels(tenant=owner).inc(delta)
                observability.audit("isolation_violation", tenant=owner, reason="foreign KV slot", count=delta)
        if c.scrubber is not None:
            scrubbed = self._delta("scrubbed_pages", c.scrubber.scrubbed_pages)
            if scrubbed and m is not None:
                m["scrubbed_pages"].inc(scrubbed)

    def _delta(self, name: str, value: int) -> int:
        delta = value - self._exported.get(name, 0)
        self._exported[name] = value
        return max(delta, 0)


class HybridCacheReport(CacheReport):
    """The same export for the hybrid tree (``integration/hybrid_cache.py``): its per-owner rows come from SGLang's
    unified tree, which it walks itself (``TenantHybridCache.tenant_stats``)."""

    def tenant_stats(self) -> dict[str, dict[str, int | None]]:
        return self.cache.tenant_stats()
