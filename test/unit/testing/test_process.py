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
