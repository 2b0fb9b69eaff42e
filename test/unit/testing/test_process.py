"""The server harness leaves nothing in the temp directory unless a server failed."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from sglang_iso_testing.process import ServerProcess, ServerStartError, free_port

HEALTHY = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            print("served", self.path, flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def _server(code: str) -> ServerProcess:
    port = free_port()
    return ServerProcess([sys.executable, "-c", code, str(port)], port)


def test_temp_log_removed_after_a_clean_stop() -> None:
    server = _server(HEALTHY).start(timeout_s=30)
    server.get("/health")
    log = server.log_path
    assert log.exists() and "served /health" in server.log_text()
    server.stop()
    assert not log.exists()


LEAVES_TEMP_FILES = (
    textwrap.dedent(
        """
    import tempfile
    tempfile.NamedTemporaryFile(delete=False)  # as SGLang names its IPC sockets
    tempfile.mkdtemp()  # and its Prometheus directory
    """
    )
    + HEALTHY
)


def test_temp_files_the_server_makes_go_with_it() -> None:
    server = _server(LEAVES_TEMP_FILES).start(timeout_s=30)
    scratch = server.scratch
    assert scratch is not None and server.env["TMPDIR"] == str(scratch)
    assert len(list(scratch.iterdir())) == 2  # positive control: the server wrote there
    server.stop()
    assert not scratch.exists()


def test_a_chosen_tmpdir_is_left_alone(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess([sys.executable, "-c", LEAVES_TEMP_FILES, str(port)], port, env={"TMPDIR": str(tmp_path)})
    server.start(timeout_s=30).stop()
    assert server.scratch is None and len(list(tmp_path.iterdir())) == 2


def test_log_kept_when_the_server_fails_to_start() -> None:
    server = _server("import sys; print('boom'); sys.exit(3)")
    with pytest.raises(ServerStartError, match="boom"):
        server.start(timeout_s=30)
    server.stop()
    try:
        assert server.keep_log and server.log_path.exists()
    finally:
        server.log_path.unlink()


def test_a_given_log_path_is_never_removed(tmp_path: Path) -> None:
    port = free_port()
    server = ServerProcess([sys.executable, "-c", HEALTHY, str(port)], port, log_path=tmp_path / "s.log")
    server.start(timeout_s=30)
    server.stop()
    assert (tmp_path / "s.log").exists()


ORPHANING = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    """
)


def test_children_of_a_launcher_that_already_exited_are_killed() -> None:
    """A launcher that exits leaves its scheduler behind; stop() still kills its whole process group."""
    import os
    import time

    server = _server(ORPHANING)
    with pytest.raises(ServerStartError):  # it exits without serving /health
        server.start(timeout_s=30)
    child = int(server.log_text().split("child", 1)[1].split()[0])
    os.kill(child, 0)  # positive control: the child outlived its launcher
    server.stop()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"child {child} of the exited launcher is still running")
    server.log_path.unlink(missing_ok=True)


def test_free_ports_are_below_the_ephemeral_range_bindable_and_never_repeated() -> None:
    import socket

    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(20000 <= p < 32000 for p in ports)  # outgoing connections take ports from 32768 up
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # it is free indeed


WITH_BUSY_SCHEDULER = (
    textwrap.dedent(
        """
    import subprocess, sys
    # a child titled as SGLang titles its scheduler (with setproctitle, whose title psutil reads)
    busy = "import setproctitle; setproctitle.setproctitle('sglang::scheduler')\\nwhile True: pass"
    subprocess.Popen([sys.executable, "-c", busy])
    """
    )
    + HEALTHY
)


def test_cpu_seconds_are_read_per_process_of_the_server() -> None:
    import time

    server = _server(WITH_BUSY_SCHEDULER).start(timeout_s=30)
    try:
        before = server.cpu_seconds()
        time.sleep(1.0)
        after = server.cpu_seconds()
    finally:
        server.stop()
    scheduler = after["scheduler"] - before["scheduler"]
    http = after["http"] - before["http"]
    assert scheduler > 0.3  # the busy child, found by its title
    assert http < 0.2 < scheduler  # the idle HTTP process is told apart from it
    assert after["detokenizer"] == 0.0
    assert after["all"] >= after["scheduler"] + after["http"]


def test_cpu_seconds_need_a_started_server() -> None:
    with pytest.raises(RuntimeError, match="not started"):
        _server(HEALTHY).cpu_seconds()
