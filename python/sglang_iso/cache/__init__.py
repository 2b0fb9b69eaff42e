"""Tenant-partitioned prefix (KV) cache: pure tree logic, no torch, no SGLang."""

from __future__ import annotations

from sglang_iso.cache.results import (
    POLICIES,
    SHARED_NAMESPACE_PREFIX,
    InsertResult,
    MatchResult,
    NamespaceStats,
    NodeHandle,
    Policy,
)
from sglang_iso.cache.tenant_radix_tree import TenantRadixTree

__all__ = [
    "POLICIES",
    "SHARED_NAMESPACE_PREFIX",
    "InsertResult",
    "MatchResult",
    "NamespaceStats",
    "NodeHandle",
    "Policy",
    "TenantRadixTree",
]
