"""The leak fuzzer's CI-sized runs: one run on a server, and its pass conditions."""

from __future__ import annotations

from typing import Any, NamedTuple

from sglang_iso.models import tiny_model_path
from sglang_iso_testing.leak_fuzzer import FuzzReport, LeakFuzzer, Tenant, shared_prefix_ids
from sglang_iso_testing.process import ServerProcess


class FuzzRun(NamedTuple):
    report: FuzzReport
    problems: list[str]
    """The fuzzer's final checks (locks, counters, integrity)."""
    tree: dict[str, Any]
    """The scheduler's tree-cache status afterwards (``/get_server_info``)."""
    tenants: dict[str, Any]
    """``GET /iso/tenants`` afterwards."""


def fuzz_on(
    server: ServerProcess, tenants: list[Tenant], admin: str, *, seed: int, ops: int, max_seconds: float,
    start_timeout_s: float = 300.0, conversations: bool = False,
) -> FuzzRun:  # fmt: skip
    """Start ``server``, fuzz it, read its final checks and status; the server is always stopped."""
    try:
        server.start(timeout_s=start_timeout_s)
        fuzzer = LeakFuzzer(server, tenants, admin, shared_prefix_ids(tiny_model_path()), seed,
                            conversations=conversations)  # fmt: skip
        report = fuzzer.run(ops=ops, max_seconds=max_seconds)
        problems = fuzzer.final_checks()
        info_status, info = server.get_with("/get_server_info", fuzzer.auth(admin))
        tenants_status, rows = server.get_with("/iso/tenants", fuzzer.auth(admin))
    finally:
        server.stop()
    assert info_status == 200 and tenants_status == 200, (info_status, tenants_status)
    return FuzzRun(report, problems, info["internal_states"][0]["sglang_iso"]["tree_cache"], rows)


def assert_clean_run(report: FuzzReport, problems: list[str], min_requests: int) -> None:
    """Enough requests, no leak, no error, clean final checks, and same-owner reuse (the positive control)."""
    assert report.requests >= min_requests, report
    assert not report.leaks, report.leaks
    assert not report.errors, report.errors
    assert not problems, problems
    assert report.same_owner_hits > 0, "positive control: same-owner reuse must happen"
