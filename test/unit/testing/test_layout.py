"""The test harness stays out of the runtime package, and the benchmarks do not reach into test/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "python" / "sglang_iso"
IMPORT_TESTING = re.compile(r"^\s*(from|import)\s+sglang_iso_testing\b", re.MULTILINE)


def test_runtime_package_never_imports_the_harness() -> None:
    # NOTE: the ``sglang-iso demo`` command is the one door from the CLI to the harness (a lazy import).
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted(RUNTIME.rglob("*.py"))
        if IMPORT_TESTING.search(path.read_text()) and path.name != "cli.py"
    ]
    assert offenders == []


def test_benchmarks_do_not_import_test_code() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "benchmark").glob("*.py"))
        if re.search(r"^\s*(from|import)\s+test\b", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []


def test_the_harness_modules_exist_where_the_tests_expect_them() -> None:
    import sglang_iso_testing.process as process
    import sglang_iso_testing.routing as routing

    assert process.ServerProcess.__module__ == "sglang_iso_testing.process"
    assert routing.router_argv.__module__ == "sglang_iso_testing.routing"
    assert not (RUNTIME / "server" / "process.py").exists()
    assert not (RUNTIME / "server" / "routing.py").exists()
