"""Real servers for end-to-end tests, started through sglang-iso's launcher.

One server per test module (about 20-40 s to start on CPU). Each fixture waits
for /health, prints the server log when a test fails, and always kills the
server's process group.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso_testing.process import ServerProcess, free_port, iso_server_argv

pytestmark = pytest.mark.e2e

CPU_SIZES = ("--max-total-tokens", "16384", "--max-running-requests", "16")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for name in getattr(item, "fixturenames", ()):
            value = item.funcargs.get(name) if hasattr(item, "funcargs") else None
            servers = value.items() if isinstance(value, dict) else [(name, value)]
            for label, server in servers:
                if isinstance(server, ServerProcess):
                    server.keep_log = True
                    report.sections.append((f"server log ({label})", server.log_tail(150)))


def start_iso_server(*extra: str, env: dict[str, str] | None = None, model: Path | None = None) -> ServerProcess:
    """A server of ``model`` (default: the bundled one) with the CPU pool sizes and ``extra`` flags (not started)."""
    port = free_port()
    return ServerProcess(iso_server_argv(port, model or tiny_model_path(), *CPU_SIZES, *extra), port, env=env)


@pytest.fixture(scope="module")
def iso_server() -> Iterator[ServerProcess]:
    server = start_iso_server()
    try:
        server.start()
        yield server
    finally:
        server.stop()
