"""Prompt-cache sharing audit (Gu et al., ICML 2025) against a live server: ``sglang-iso audit``.

Modules: :mod:`.client` (timed requests per API), :mod:`.prompts` (fresh random prompts), :mod:`.method`
(the victim/attacker sampling procedure), :mod:`.stats` (KS test and ``cached_tokens`` oracle),
:mod:`.report` (table, JSON, plot), :mod:`.runner` (options and :func:`main`).
"""

from __future__ import annotations

from .runner import AuditConfig, AuditReport, main, run_audit, write_outputs
from .stats import OracleResult, ScopeResult

__all__ = ["AuditConfig", "AuditReport", "OracleResult", "ScopeResult", "main", "run_audit", "write_outputs"]
