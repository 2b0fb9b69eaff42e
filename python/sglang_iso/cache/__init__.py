"""Tenant-partitioned prefix (KV) cache: pure tree logic, no torch, no SGLang."""

from __future__ import annotations

from sglang_iso.cache.results import (
    InsertResult,
    MatchResult,
    NamespaceStats,
    NodeHandle,
)
from sglang_iso.cache.tenant_radix_tree import TenantRadixTree

__all__ = [
    "InsertResult",
    "MatchResult",
    "NamespaceStats",
    "NodeHandle",
    "TenantRadixTree",
]
