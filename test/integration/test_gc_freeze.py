"""SGLang's post-start ``/freeze_gc`` call, made with the gate's internal key once the server listens."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_iso.integration.front import gc_freeze, state
from sglang_iso_testing.process import free_port


def late_server(port: int, status: int, delay_s: float) -> tuple[list[tuple[str, str | None]], threading.Thread]:
    """An HTTP server that starts listening after ``delay_s`` and answers one POST with ``status``."""
    seen: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    def serve() -> None:
        time.sleep(delay_s)
        with ThreadingHTTPServer(("127.0.0.1", port), Handler) as httpd:
            httpd.handle_request()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return seen, thread


def server_args(port: int) -> SimpleNamespace:
    return SimpleNamespace(url=lambda: f"http://127.0.0.1:{port}", ssl_ca_certs=None, ssl_certfile=None)


def never(*_args: Any, **_kwargs: Any) -> None:
    raise AssertionError("SGLang's own call (without a key the gate accepts) must not run behind the gate")


def test_call_waits_for_the_listener_and_carries_the_internal_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "_CURRENT", SimpleNamespace(internal_key="internal-123"))
    port = free_port()
    seen, thread = late_server(port, 200, delay_s=0.6)
    assert gc_freeze.freeze_gc_through_gate(never, server_args(port)) is None
    thread.join(timeout=10)
    assert seen == [("/freeze_gc", "Bearer internal-123")]


def test_refused_call_is_logged_not_raised(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(state, "_CURRENT", SimpleNamespace(internal_key="internal-123"))
    port = free_port()
    seen, thread = late_server(port, 401, delay_s=0.0)
    with caplog.at_level(logging.WARNING, logger=gc_freeze.__name__):
        assert gc_freeze.freeze_gc_through_gate(never, server_args(port)) is None
    thread.join(timeout=10)
    assert len(seen) == 1
    assert "freeze_gc failed" in caplog.text


def test_without_the_gate_sglang_makes_its_own_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "_CURRENT", None)
    calls: list[Any] = []
    gc_freeze.freeze_gc_through_gate(lambda args: calls.append(args), "server-args")
    assert calls == ["server-args"]
