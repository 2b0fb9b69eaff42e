"""Timed requests to a server, one API per class: time to first token (streaming) or total latency.

The registry :data:`APIS` maps the ``--api`` choices to clients. A client sends one prompt with one key and
returns a :class:`Timing`: the latency, and what the response says about the prompt (``prompt_tokens`` and the
``cached_tokens`` oracle, when the server reports it).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, ClassVar

MAX_STREAM_LINES = 256
"""A response with more lines than this is cut off (we ask for one token; a few lines are expected)."""


class AuditRequestError(RuntimeError):
    """A request failed (HTTP error, bad response, timeout); the message names the URL and status."""


@dataclass(frozen=True)
class Timing:
    """One timed request."""

    latency_s: float
    """Seconds from sending the request to its first streamed token (``ttft``) or to the full response (``total``)."""
    prompt_tokens: int | None
    """The server's count of prompt tokens; None when the response does not say."""
    cached_tokens: int | None
    """Prompt tokens the server says it served from cache (the oracle); None when the response does not say."""


class Client:
    """Base class: sends ``prompt`` with ``key`` and times it.

    Args:
        base_url: server root, e.g. ``http://127.0.0.1:30000`` (a trailing ``/v1`` is accepted).
        timing: ``ttft`` (stream, time to the first token event) or ``total`` (no stream, ``max_tokens=1``).
        model: the ``model`` field of OpenAI requests.
        timeout_s: per-request timeout.
    """

    name: ClassVar[str] = ""
    path: ClassVar[str] = ""

    def __init__(
        self, base_url: str, *, timing: str = "ttft", model: str = "default", timeout_s: float = 120.0
    ) -> None:
        if timing not in TIMINGS:
            raise ValueError(f"unknown timing {timing!r}; choose from {list(TIMINGS)}")
        root = base_url.rstrip("/")
        self.root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.timing = timing
        self.model = model
        self.timeout_s = timeout_s

    def measure(self, key: str | None, prompt: str) -> Timing:
        """Send ``prompt`` once (one output token, greedy) and time it.

        Raises:
            AuditRequestError: non-200 status, unreadable body, or no token event in the stream.
        """
        stream = self.timing == "ttft"
        body = json.dumps(self.payload(prompt, stream=stream)).encode()
        req = urllib.request.Request(self.root + self.path, data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            start = time.perf_counter()
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                if stream:
                    return self._read_stream(resp, start)
                raw = resp.read()
                latency = time.perf_counter() - start
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode(errors="replace")
            raise AuditRequestError(f"POST {self.root + self.path}: HTTP {e.code}: {detail}") from e
        except (urllib.error.URLError, OSError) as e:
            raise AuditRequestError(f"POST {self.root + self.path}: {e}") from e
        try:
            event = json.loads(raw)
        except ValueError as e:
            raise AuditRequestError(f"POST {self.root + self.path}: response is not JSON: {raw[:200]!r}") from e
        prompt_tokens, cached = self.usage(event)
        return Timing(latency, prompt_tokens, cached)

    def _read_stream(self, resp: Any, start: float) -> Timing:
        first: float | None = None
        prompt_tokens: int | None = None
        cached: int | None = None
        for n, line in enumerate(resp):
            if n >= MAX_STREAM_LINES:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:") :].strip()
            if data == b"[DONE]":
                break
            try:
                event = json.loads(data)
            except ValueError as e:
                raise AuditRequestError(f"POST {self.root + self.path}: bad stream event {data[:200]!r}") from e
            if first is None and self.is_token_event(event):
                first = time.perf_counter() - start
            p, c = self.usage(event)
            prompt_tokens = p if p is not None else prompt_tokens
            cached = c if c is not None else cached
        if first is None:
            raise AuditRequestError(f"POST {self.root + self.path}: the stream carried no token event")
        return Timing(first, prompt_tokens, cached)

    # ------------------------------------------------------------------ per-API parts

    def payload(self, prompt: str, *, stream: bool) -> dict[str, Any]:
        raise NotImplementedError

    def is_token_event(self, event: dict[str, Any]) -> bool:
        """True for the stream event that carries the first generated token."""
        raise NotImplementedError

    def usage(self, event: dict[str, Any]) -> tuple[int | None, int | None]:
        """``(prompt_tokens, cached_tokens)`` from one response or stream event; None where absent."""
        raise NotImplementedError


class OpenAIClient(Client):
    """``POST /v1/completions``; the oracle is ``usage.prompt_tokens_details.cached_tokens``.

    SGLang fills ``prompt_tokens_details`` only when started with ``--enable-cache-report``.
    """

    name = "openai"
    path = "/v1/completions"

    def payload(self, prompt: str, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return body

    def is_token_event(self, event: dict[str, Any]) -> bool:
        return bool(event.get("choices"))

    def usage(self, event: dict[str, Any]) -> tuple[int | None, int | None]:
        usage = event.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return _int_or_none(usage.get("prompt_tokens")), _int_or_none(details.get("cached_tokens"))


class SGLangClient(Client):
    """``POST /generate`` (SGLang's native API); the oracle is ``meta_info.cached_tokens``.

    No ``cache_salt`` or ``extra_key`` is sent: on an open upstream server every client shares one cache.
    """

    name = "sglang"
    path = "/generate"

    def payload(self, prompt: str, *, stream: bool) -> dict[str, Any]:
        return {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}, "stream": stream}

    def is_token_event(self, event: dict[str, Any]) -> bool:
        return "text" in event or "output_ids" in event

    def usage(self, event: dict[str, Any]) -> tuple[int | None, int | None]:
        meta = event.get("meta_info") or {}
        return _int_or_none(meta.get("prompt_tokens")), _int_or_none(meta.get("cached_tokens"))


APIS: dict[str, type[Client]] = {c.name: c for c in (OpenAIClient, SGLangClient)}
"""``--api`` choice -> client class."""

TIMINGS = {"ttft": "time to first token (streaming)", "total": "total latency of a one-token response"}


def make_client(api: str, base_url: str, **kwargs: Any) -> Client:
    """The client for ``api``.

    Raises:
        ValueError: unknown ``api`` (the message lists the choices).
    """
    if api not in APIS:
        raise ValueError(f"unknown api {api!r}; choose from {sorted(APIS)}")
    return APIS[api](base_url, **kwargs)


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
