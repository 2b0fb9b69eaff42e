"""`make demo` runs end to end: same-tenant hit, cross-tenant miss, 401, per-tenant stats."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_demo_shows_hit_miss_and_401() -> None:
    out = subprocess.run([sys.executable, "-m", "sglang_iso_testing.demo"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        m = re.match(r"^(acme|globex)\s+([a-z][a-z ]*?)\s+(\d+)\s+(\d+)\s\s", line)
        if m:
            rows[(m.group(1), m.group(2))] = int(m.group(4))
    assert rows[("acme", "first request")] == 0
    assert rows[("acme", "same prompt again")] > 0  # same tenant: cached tokens
    assert rows[("globex", "same prompt")] == 0  # other tenant: none
    assert "HTTP 401" in out.stdout
    assert "per-tenant cache statistics" in out.stdout
    # The statistics agree with what the clients were served: acme's cached tokens are the sum of its rows'.
    stats = re.search(r"^acme\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+\s+\d+", out.stdout, re.MULTILINE)
    assert stats is not None, out.stdout
    acme_rows = [cached for (tenant, _), cached in rows.items() if tenant == "acme"]
    assert int(stats.group(1)) == len(acme_rows) and int(stats.group(3)) == sum(acme_rows), out.stdout
