"""Ruff and mypy are part of the suite: the code base stays clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_clean() -> None:
    out = _run(str(BIN / "ruff"), "check", "python", "test", "scripts", "benchmark", "examples", "sgl-kernel-patches")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_clean() -> None:
    out = _run(str(BIN / "mypy"))
    assert out.returncode == 0, out.stdout + out.stderr
