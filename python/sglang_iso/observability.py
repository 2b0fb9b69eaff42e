"""Per-tenant Prometheus series and the audit log.

Metrics use the ``sglang_iso:`` prefix and are exported on SGLang's own
``/metrics`` when the server runs with ``--enable-metrics`` (SGLang then sets up
prometheus_client's multiprocess mode, so series created in the scheduler and in
the HTTP process are merged). The ``tenant`` label only ever takes configured
tenant or group ids; no key, prompt or namespace secret appears in any label.

The audit log (``--iso-audit-log PATH``) is JSON lines, size-rotated: cache hits
(time, tenant, short namespace id, hit and prompt length, request id), auth
failures, admin actions. The scheduler writes isolation violations to
``PATH.scheduler`` (a separate file: rotation is per process). No prompt text.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import time
from typing import Any

from sglang_iso.settings import current as current_settings

AUDIT_MAX_BYTES = 64 * 1024 * 1024
AUDIT_BACKUPS = 5

_metrics: dict[str, Any] | None = None
_audit: logging.Logger | None = None


def metrics_enabled() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


UNVERIFIED_TENANT = "unverified"
"""``tenant`` label of isolation violations by requests whose namespace tag did not verify."""


def metrics() -> dict[str, Any] | None:
    """The metric objects, created on first use in this process; None when metrics are off."""
    global _metrics
    if _metrics is not None or not metrics_enabled():
        return _metrics
    from prometheus_client import Counter, Gauge

    _metrics = {
        "prompt_tokens": Counter("sglang_iso:prompt_tokens", "Prompt tokens of finished requests", ["tenant"]),
        "cached_tokens": Counter("sglang_iso:cached_tokens", "Prompt tokens served from the cache", ["tenant"]),
        "auth_failures": Counter("sglang_iso:auth_failures", "Requests refused by the tenant gate", ["reason"]),
        "evicted_tokens": Counter("sglang_iso:evicted_tokens", "Cached tokens released", ["tenant"]),
        "violations": Counter("sglang_iso:isolation_violations", "Isolation violations (must stay 0)", ["tenant"]),
        "scrubbed_pages": Counter("sglang_iso:scrubbed_pages", "KV pages zeroed after free", []),
        "resident_tokens": Gauge(
            "sglang_iso:resident_tokens", "Cached tokens per tenant", ["tenant"], multiprocess_mode="livesum"
        ),
        "host_resident_tokens": Gauge(
            "sglang_iso:host_resident_tokens",
            "Tokens per tenant in the host tier (L2)",
            ["tenant"],
            multiprocess_mode="livesum",
        ),
        "l3_resident_tokens": Gauge(
            "sglang_iso:l3_resident_tokens",
            "Tokens per tenant in L3 storage (files this rank indexed)",
            ["tenant"],
            multiprocess_mode="livesum",
        ),
        "tier_quota_tokens": Gauge(
            "sglang_iso:tier_quota_tokens",
            "Host (L2) and L3 token quota per tenant (0: no per-tenant cap)",
            ["tenant", "tier"],
            multiprocess_mode="livemax",
        ),
        "l3_pruned_tokens": Counter(
            "sglang_iso:l3_pruned_tokens", "Tokens deleted from L3 for a quota or the overall cap", ["tenant"]
        ),
        "tier_loaded_tokens": Counter(
            "sglang_iso:tier_loaded_tokens", "Tokens loaded back to the device per tenant", ["tenant", "tier"]
        ),
        "quota_tokens": Gauge(
            "sglang_iso:quota_tokens", "Resident-token quota per namespace", ["tenant"], multiprocess_mode="livemax"
        ),
        "pd_timed_out_transfers": Counter(
            "sglang_iso:pd_timed_out_transfers", "PD transfers not drained in time (pages kept quarantined)", []
        ),
        "pd_tag_violations": Counter(
            "sglang_iso:pd_tag_violations", "PD transfers refused: KV tagged for another namespace", []
        ),
        "pd_quarantined_pages": Gauge(
            "sglang_iso:pd_quarantined_pages",
            "KV pages held back from reuse by PD transfers",
            [],
            multiprocess_mode="livesum",
        ),
    }
    # NOTE: a counter series must exist at 0 before its first increment, or increase() in an alert sees a series
    # that starts at 1 and reports no increase: the unverified-tag series is made now, each tenant's on export.
    _metrics["violations"].labels(tenant=UNVERIFIED_TENANT)
    return _metrics


def audit_logger() -> logging.Logger | None:
    """The audit logger of this process (None without ``--iso-audit-log``)."""
    global _audit
    path = current_settings().audit_log
    if _audit is not None or not path:
        return _audit
    return _open_audit(path)


def scheduler_audit_logger() -> logging.Logger | None:
    path = current_settings().audit_log
    if not path:
        return None
    global _audit
    if _audit is None:
        _open_audit(path + ".scheduler")
    return _audit


def audit(event: str, **fields: Any) -> None:
    """Append one JSON line (``time``, ``event`` and ``fields``) if the audit log is on."""
    log = _audit if _audit is not None else audit_logger()
    if log is None:
        return
    log.info(json.dumps({"time": round(time.time(), 3), "event": event, **fields}, sort_keys=True))


def _open_audit(path: str) -> logging.Logger:
    global _audit
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=AUDIT_MAX_BYTES, backupCount=AUDIT_BACKUPS)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger(f"sglang_iso.audit.{os.getpid()}")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    _audit = log
    return log
