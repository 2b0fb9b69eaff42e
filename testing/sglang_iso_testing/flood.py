"""One tenant floods a server with long streams while another measures its short requests.

Shared by ``benchmark/fairness.py`` and the e2e fairness test: plain ``http.client``
streams of ``/generate``, one thread each, that count what they receive.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any


def stream(
    port: int,
    key: str,
    body: dict[str, Any],
    *,
    timeout_s: float = 600,
    stop: threading.Event | None = None,
    on_chunk: Callable[[], None] | None = None,
) -> tuple[int, float | None, str | None]:
    """POST a streaming /generate; (status, seconds to the first token chunk, Retry-After).

    Reading ends at the end of the stream, or early (the connection closed, so the server aborts the request)
    once ``stop`` is set; ``on_chunk`` is called for every chunk received.
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    t0 = time.perf_counter()
    try:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        conn.request("POST", "/generate", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return resp.status, None, resp.getheader("retry-after")
        ttft = None
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            if on_chunk is not None:
                on_chunk()
            if stop is not None and stop.is_set():
                break
        return 200, ttft, None
    finally:
        conn.close()


def short_body(tokens: int = 8) -> dict[str, Any]:
    """A short streamed question (about 30 prompt tokens), greedy."""
    text = f"{uuid.uuid4().hex} short question " + " ".join(f"w{i}" for i in range(24))
    return {"text": text, "stream": True, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}


def long_body(tokens: int) -> dict[str, Any]:
    """A streamed request that generates exactly ``tokens`` tokens (``ignore_eos``; about 100 prompt tokens)."""
    text = f"{uuid.uuid4().hex} long story " + " ".join(f"s{i}" for i in range(48))
    return {"text": text, "stream": True, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}


class Flood:
    """``streams`` threads of one tenant, each re-opening a long stream (``long_body(tokens)``) until closed.

    Counters (read them any time): ``served`` streams that ended, ``refused`` answers other than 200
    (a 429 is retried after its ``Retry-After``), ``chunks`` streamed chunks received in all.
    """

    def __init__(self, port: int, key: str, streams: int, tokens: int) -> None:
        self.stop = threading.Event()
        self.served = 0
        self.refused = 0
        self.chunks = 0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(port, key, tokens), daemon=True) for _ in range(streams)
        ]
        for t in self._threads:
            t.start()

    def _chunk(self) -> None:
        with self._lock:
            self.chunks += 1

    def _run(self, port: int, key: str, tokens: int) -> None:
        while not self.stop.is_set():
            status, _, retry_after = stream(port, key, long_body(tokens), stop=self.stop, on_chunk=self._chunk)
            with self._lock:
                if status == 200:
                    self.served += 1
                else:
                    self.refused += 1
            if status == 429:
                self.stop.wait(float(retry_after or 1))

    def close(self, timeout_s: float = 600) -> None:
        """Stop re-opening, drop the open streams at their next chunk, and wait for the threads."""
        self.stop.set()
        for t in self._threads:
            t.join(timeout=timeout_s)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
