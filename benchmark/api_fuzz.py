"""Long run of the API fuzz (``test/e2e/test_api_fuzz.py``) against a live sglang-iso server.

Usage::

    python benchmark/api_fuzz.py [--examples 5000]

Runs the same property-based fuzz as the test suite (bodies generated from the server's OpenAPI schema, every
tenant route and method, hostile fields mixed into valid bodies) with many more requests, printing progress
(requests done, rate, ETA) every 25 requests. Oracles as in the test: no 5xx, the server alive, both tenants still
served with a same-tenant cache hit and no cross-tenant hit, no isolation violation.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=5000, help="requests to send")
    args = parser.parse_args()
    env = {**os.environ, "SGLANG_ISO_FUZZ_EXAMPLES": str(args.examples)}
    cmd = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", "--timeout", "0",
           str(ROOT / "test" / "e2e" / "test_api_fuzz.py")]  # fmt: skip
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
