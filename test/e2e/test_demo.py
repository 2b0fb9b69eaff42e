"""`make demo` runs end to end: same-tenant hit, cross-tenant miss, 401, per-tenant stats."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_demo_shows_hit_miss_and_401() -> None:
    out = subprocess.run([sys.executable, "-m", "sglang_iso.demo"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {
        line.split()[0] + " " + " ".join(line.split()[1:3]): line.split()
        for line in out.stdout.splitlines()
        if line.startswith(("acme ", "globex "))
    }
    again = lines["acme same prompt"]
    cross = lines["globex same prompt"]
    assert int(again[-2]) > 0  # same tenant: cached tokens
    assert int(cross[-2]) == 0  # other tenant: none
    assert "HTTP 401" in out.stdout
    assert "per-tenant cache statistics" in out.stdout
