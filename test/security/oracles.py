"""The leak fuzzer's pass conditions, shared by the CI-sized fuzz runs."""

from __future__ import annotations

from sglang_iso_testing.leak_fuzzer import FuzzReport


def assert_clean_run(report: FuzzReport, problems: list[str], min_requests: int) -> None:
    """Enough requests, no leak, no error, clean final checks, and same-owner reuse (the positive control)."""
    assert report.requests >= min_requests, report
    assert not report.leaks, report.leaks
    assert not report.errors, report.errors
    assert not problems, problems
    assert report.same_owner_hits > 0, "positive control: same-owner reuse must happen"
