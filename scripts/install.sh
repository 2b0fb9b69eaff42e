#!/usr/bin/env bash
# Install sglang-iso and its pinned SGLang stack into a virtualenv (default .venv).
#
# pip's resolver cannot install sglang on a CPU-only machine (a CUDA-only
# dependency has no installable distribution), so the runtime set is installed
# with --no-deps from an exact, tested list: requirements/runtime.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# Mooncake's transfer engine (prefill/decode KV over TCP, requirements/runtime.txt) links libibverbs even when it
# only uses TCP: install the Debian library when it is missing and we may.
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null; } \
      || echo "warning: could not install libibverbs1: prefill/decode disaggregation (mooncake) will not start" >&2
  else
    echo "warning: libibverbs1 is missing: prefill/decode disaggregation (mooncake) will not start" >&2
  fi
fi
# promtool (Debian's prometheus package) checks and unit-tests the alerting rules in make test, and the
# tests say so when they skip.
if ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
      || echo "warning: could not install prometheus: the alert-rule tests will be skipped" >&2
  else
    echo "warning: promtool is missing (apt-get install prometheus): the alert-rule tests will be skipped" >&2
  fi
fi
# Headless Chromium renders the evidence report to PDF (`sglang-iso evidence --pdf`), and the test that checks the
# page as a browser lays it out needs it.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
      || echo "warning: could not install chromium: the evidence rendering test will be skipped" >&2
  else
    echo "warning: chromium is missing (apt-get install chromium): the evidence rendering test will be skipped" >&2
  fi
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --no-deps -r requirements/runtime.txt
"${PIP[@]}" -r requirements/dev.txt
"${PIP[@]}" --no-deps -r requirements/deploy.txt
"${PIP[@]}" --no-deps -e .
# The test harness is a distribution of its own (testing/): tests, benchmarks and the demo use it; the image never
# has it.
"${PIP[@]}" --no-deps -e testing
# CPU shims at interpreter start, so `import sglang` works in this environment like in any SGLang one.
"$VENV/bin/python" -m sglang_iso.cli cpu-hook install
# Smoke check: the plugin is discoverable and the CPU shims let SGLang import.
"$VENV/bin/python" - <<'PY'
from importlib.metadata import entry_points
names = [ep.name for ep in entry_points(group="sglang.srt.plugins")]
assert "sglang_iso" in names, f"sglang-iso plugin not registered: {names}"
import sglang  # noqa: F401  (the interpreter-start hook applies the CPU shims)
import sglang.srt.mem_cache.registry  # noqa: F401
import sglang_iso_testing.process  # noqa: F401  (the test harness, installed from testing/)
print("sglang-iso installed")
PY
