"""An in-process stand-in for an SGLang server: streams one token after a delay that depends on a cache hit.

``shared=True`` behaves like upstream SGLang (one cache for every key); ``shared=False`` like sglang-iso with a
tenants file (one cache per tenant, keys mapped to tenants by ``tenants``). A miss sleeps ``miss_s``, a hit
``hit_s``. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeCacheServer:
    def __init__(self, *, shared: bool, tenants: dict[str, str], miss_s: float = 0.02, hit_s: float = 0.001) -> None:
        self.shared = shared
        self.tenants = tenants
        self.miss_s = miss_s
        self.hit_s = hit_s
        self.cache: set[tuple[str, str]] = set()
        self.lock = threading.Lock()
        self.requests = 0

    def handle(self, key: str | None, prompt: str) -> tuple[int, int]:
        """(prompt_tokens, cached_tokens) after sleeping like a prefill would."""
        namespace = "global" if self.shared else self.tenants.get(key or "", "anonymous")
        tokens = len(prompt.split()) * 2
        with self.lock:
            self.requests += 1
            hit = (namespace, prompt) in self.cache
            self.cache.add((namespace, prompt))
        time.sleep(self.hit_s if hit else self.miss_s)
        return tokens, tokens - 1 if hit else 0


def _handler(fake: FakeCacheServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            auth = self.headers.get("Authorization", "")
            key = auth.removeprefix("Bearer ") if auth else None
            if fake.tenants and key not in fake.tenants:
                self._send(401, {"error": {"code": "invalid_api_key"}})
                return
            prompt = body.get("text", body.get("prompt", ""))
            tokens, cached = fake.handle(key, prompt)
            events: list[dict[str, Any]]
            if self.path == "/generate":
                events = [{"text": "x", "meta_info": {"prompt_tokens": tokens, "cached_tokens": cached}}]
            else:
                usage: dict[str, Any] = {"prompt_tokens": tokens, "prompt_tokens_details": {"cached_tokens": cached}}
                events = [{"choices": [{"text": "x"}], "usage": None}, {"choices": [], "usage": usage}]
            if not body.get("stream"):
                merged = events[0] | ({"usage": events[-1]["usage"]} if self.path != "/generate" else {})
                self._send(200, merged)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in events:
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

        def _send(self, status: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextmanager
def serve(fake: FakeCacheServer) -> Iterator[str]:
    """Run ``fake`` on a free 127.0.0.1 port; yields its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
