"""The HTTP gate: every request is authenticated and sanitized before SGLang sees it.

A pure ASGI middleware (no Starlette base class, so the handler runs in the same
task and sees what the gate records). It is the outermost layer of the app:

* ``lifespan`` scopes pass; WebSocket (and any other) scopes are refused: the gate
  cannot check what a socket sends later.
* ``OPEN_PATHS`` (health probes) pass through; ``/metrics`` too unless the
  operator asked for it to need the admin key (``metrics_need_admin``).
* Everything else needs ``Authorization: Bearer <key>``; a missing or unknown
  key gets 401 with an OpenAI-style JSON error.
* ``TENANT_PATHS`` (generation, embeddings, model info) need a tenant key. The
  body, on every method, is checked by :mod:`sglang_iso.server.request_rules`
  (JSON object, depth, forbidden fields, token ids, logprob counts, request ids
  moved into the tenant's id space); an encoded body is refused (415). The
  tenant gets a slot from :class:`~sglang_iso.server.admission.Admission` or 429.
  The tenant id is stored in ``scope["state"]``, and so is the idle retention the request asks for with
  ``X-Cache-TTL-Seconds`` (a whole number of seconds, 1 to ``MAX_ASKED_TTL_S``; anything else gets 400 naming
  the header): it can only shorten the tenant's retention (:mod:`sglang_iso.server.retention`).
* The PD router's key (``router_key_sha256``) reads worker info and forwards
  generation for the tenant its request ids name (in the body, or ``X-Request-ID`` for a
  body without ids: :mod:`sglang_iso.server.pd_rules`);
  only it may set the ``bootstrap_*`` fields, which a PD worker requires.
* Every other path (flush, abort, adapters, weights, profiling, internal state,
  /iso/*) needs an admin key (403 for a tenant key): unknown paths fail closed.
* Slow clients: a request body must arrive within ``body_timeout_s`` (408), and a tenant may have at most
  ``max_body_reads`` bodies arriving at once (429), so a tenant trickling bodies over many connections holds
  nothing another tenant needs. Connections that never finish their headers never reach an ASGI app; they cost
  the server a socket each and are bounded where connections are accepted (the ingress; ``deploy/``).
* The server's own calls to itself (``INTERNAL_PATHS``: SGLang's post-start GC freeze) carry a key made at
  start in this process's memory (``internal_key``), good for those paths only and for nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

import orjson

from sglang_iso import observability
from sglang_iso.server import adapters, pd_rules, rate_limits, request_rules
from sglang_iso.server.admission import RETRY_AFTER_S, Admission
from sglang_iso.server.pd_rules import PdRole
from sglang_iso.server.rate_limits import RateLimiter, Verdict
from sglang_iso.server.request_rules import Limits, Refusal
from sglang_iso.tenancy.keys import KeyIndex, Principal, parse_bearer

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

STATE_TENANT = "sglang_iso_tenant"
STATE_CACHE_TTL = "sglang_iso_cache_ttl"
CACHE_TTL_HEADER = "x-cache-ttl-seconds"
MAX_ASKED_TTL_S = 2**31 - 1


def asked_ttl(value: str) -> int | None:
    """The seconds an ``X-Cache-TTL-Seconds`` value asks for, or None when it is not 1..``MAX_ASKED_TTL_S``."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 10:
        return None
    seconds = int(text)
    return seconds if 1 <= seconds <= MAX_ASKED_TTL_S else None


OPEN_PATHS = frozenset({"/health", "/health_generate"})
INTERNAL_PATHS = frozenset({"/freeze_gc"})
"""Paths the server calls on itself once started: SGLang freezes the garbage collector of every process after
start-up (``/freeze_gc``), so later full collections skip the start-up heap (otherwise a full collection of the
HTTP process's ~750k start-up objects stalls every request for most of a second)."""
METRICS_PATH = "/metrics"
METRICS_ACCEPT = b"text/plain; version=0.0.4"
"""What a /metrics request asks for, whatever the scraper sent: in the text format metric names keep their colons
(``sglang_iso:cached_tokens_total``), while prometheus_client answers an OpenMetrics request without UTF-8
escaping (Prometheus 2.x) with ``sglang_iso_cached_tokens_total``, which no dashboard or alert would find."""

TENANT_PATHS = frozenset(
    {
        "/generate",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/encode",
        "/classify",
        "/v1/classify",
        "/v1/rerank",
        "/v1/score",
        "/v1/models",
        "/get_model_info",
        "/model_info",
        "/v1/tokenize",
        "/v1/detokenize",
        "/tokenize",
        "/detokenize",
    }
)

# Headers a tenant may not send.
FORBIDDEN_HEADERS: dict[str, str] = {
    "x-data-parallel-rank": "routing is decided by the server",
    # NOTE: the gate checks the bytes it reads; a body decoded later (SGLang's request decompression) would
    # reach SGLang unchecked, so encoded bodies are refused.
    "x-body-compressed": "compressed request bodies are not accepted",
}
MAX_BODY_BYTES = 64 * 1024 * 1024
_ROUTER_READER = "<router>"  # NOTE: not a valid tenant id (names.py): the router's bodies are counted apart
BODY_TIMEOUT_S = 30.0
"""Seconds a request body may take to arrive (after its headers); a slower one gets 408."""
MAX_BODY_READS = 64
"""Bodies one tenant may have arriving at once; the next connection gets 429."""


class KeyLookup(Protocol):
    def lookup(self, presented_key: str) -> Principal | None: ...

    def tenant(self, tenant_id: str) -> Principal | None: ...


class ReloadableKeys:
    """A :class:`KeyIndex` that can be swapped atomically (tenants-file reload on SIGHUP)."""

    def __init__(self, index: KeyIndex) -> None:
        self.index = index

    def lookup(self, presented_key: str) -> Principal | None:
        return self.index.lookup(presented_key)

    def tenant(self, tenant_id: str) -> Principal | None:
        return self.index.tenant(tenant_id)

    def swap(self, index: KeyIndex) -> None:
        self.index = index  # one reference assignment: a request sees the old or the new index, never a mix


class TenantGate:
    """ASGI middleware enforcing tenant authentication (see module doc).

    ``keys`` is consulted on every request, so swapping its index (config
    reload) takes effect for the next request without touching requests in flight.
    ``limits`` bounds token ids and budgets (None: only the model-independent rules);
    ``admission`` caps each tenant's requests in flight (None: no cap); ``rates`` its requests and tokens per
    minute, with OpenAI's ``x-ratelimit-*`` headers on its responses (None: no rate limits); ``on_start`` runs
    once, on the event loop, at the first ASGI event (the server's lifespan start): it starts background tasks.
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyLookup,
        limits: Limits | None = None,
        admission: Admission | None = None,
        metrics_need_admin: bool = False,
        pd: PdRole | None = None,
        rates: RateLimiter | None = None,
        count_tokens: Callable[[str], int] | None = None,
        internal_key: str | None = None,
        on_start: Callable[[], None] | None = None,
        body_timeout_s: float = BODY_TIMEOUT_S,
        max_body_reads: int = MAX_BODY_READS,
    ) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.max_body_reads = max_body_reads
        self._reading: dict[str, int] = {}  # tenant (or "router") -> bodies arriving now; event loop only
        self.on_start = on_start
        self.internal_key = internal_key  # this process's own calls to INTERNAL_PATHS, None: none accepted
        self.rates = rates  # per-tenant requests and tokens per minute, None: no rate limits
        self.count_tokens = count_tokens  # the served model's token count of a text, for token reservations
        self.pd = pd  # this worker's prefill/decode role, None when not disaggregated
        self.keys = keys
        self.limits = limits
        self.admission = admission
        self.metrics_need_admin = metrics_need_admin
        self.rejected = 0  # requests refused (401/403/400/413/415/429)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.on_start is not None:
            start, self.on_start = self.on_start, None
            start()
        kind = scope.get("type")
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        if kind != "http":
            await self._refuse_socket(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if path == METRICS_PATH:
            scope = _text_format(scope)
        if path in OPEN_PATHS or (path == METRICS_PATH and not self.metrics_need_admin):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        principal = None
        key = parse_bearer(headers.get("authorization"))
        if key is not None and path in INTERNAL_PATHS and self._is_internal(key):
            observability.audit("internal_action", method=scope.get("method"), path=path)
            await self.app(scope, receive, send)
            return
        if key is not None:
            principal = self.keys.lookup(key)
        if principal is None:
            _refused("missing_key" if key is None else "unknown_key", path)
            await self._error(send, 401, "invalid_api_key", "Missing or unknown API key.", "authentication_error")
            return
        if principal.is_router:
            await self._router_request(scope, receive, send, headers, path)
            return
        if path not in TENANT_PATHS:
            if not principal.is_admin:
                _refused("admin_required", path, tenant=principal.tenant_id)
                await self._error(send, 403, "admin_required", f"{path} needs an admin key.", "permission_error")
                return
            if path != METRICS_PATH:
                observability.audit("admin_action", method=scope.get("method"), path=path)
            await self.app(scope, receive, send)
            return
        if principal.is_admin or principal.tenant_id is None:
            _refused("tenant_key_required", path)
            await self._error(
                send, 403, "tenant_key_required", "Generation needs a tenant key, not an admin key.", "permission_error"
            )
            return
        await self._tenant_request(scope, receive, send, principal, headers)

    async def _router_request(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], path: str
    ) -> None:
        """The PD router's key: worker registration reads, and generation forwarded for one tenant."""
        if path in pd_rules.ROUTER_INFO_PATHS and scope.get("method") in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        if path not in pd_rules.ROUTER_TENANT_PATHS:
            _refused("router_path", path)
            await self._error(send, 403, "router_path", f"{path} is not offered to the router key.", "permission_error")
            return
        body = await self._receive_body(scope, receive, send, _ROUTER_READER)
        if body is None:
            return
        try:
            obj = orjson.loads(body)  # (SGLang's parser, as in request_rules.check_body)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict) and pd_rules.router_rid_header(obj, headers.get(pd_rules.REQUEST_ID_HEADER)):
            body = orjson.dumps(obj)  # NOTE: a chat body lost its id in sglang-router; the header kept it
        found = pd_rules.router_tenant(obj) if isinstance(obj, dict) else pd_rules.PdRefusal("rid", "missing")
        principal = self.keys.tenant(found) if isinstance(found, str) else None
        if principal is None:
            field, why = found if isinstance(found, pd_rules.PdRefusal) else ("rid", "names no tenant of this server")
            _refused("router_tenant", path)
            await self._error(send, 400, "invalid_field", f"Field {field!r} {why}.", param=field)
            return
        await self._tenant_request(scope, receive, send, principal, headers, body=body, from_router=True)

    async def _tenant_request(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        principal: Principal,
        headers: dict[str, str],
        *,
        body: bytes | None = None,
        from_router: bool = False,
    ) -> None:
        tenant = str(principal.tenant_id)
        for header, why in FORBIDDEN_HEADERS.items():
            if header in headers:
                await self._error(
                    send, 400, "forbidden_header", f"Header {header!r} is not allowed: {why}.", param=header
                )
                return
        ttl = headers.get(CACHE_TTL_HEADER)
        asked = asked_ttl(ttl) if ttl is not None else None
        if ttl is not None and asked is None:
            await self._error(
                send, 400, "invalid_header",
                f"Header {CACHE_TTL_HEADER!r} must be a whole number of seconds from 1 to {MAX_ASKED_TTL_S}.",
                param=CACHE_TTL_HEADER,
            )  # fmt: skip
            return
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await self._error(
                send, 415, "unsupported_encoding", f"Content-Encoding {encoding!r} is not accepted.",
                param="content-encoding",
            )  # fmt: skip
            return
        # NOTE: every method, not only POST: SGLang serves /generate and others on PUT too.
        if body is None:
            body = await self._receive_body(scope, receive, send, tenant)
        if body is None:
            return
        checked = request_rules.check_body(
            body, tenant, self.limits, path=str(scope.get("path", "")), pd=self.pd, from_router=from_router
        )
        if isinstance(checked, Refusal):
            await self._error(send, checked.status, checked.code, checked.message, param=checked.field)
            return
        adapter_refusal = adapters.check_body(principal.adapters, checked.obj) if checked.obj is not None else None
        if adapter_refusal is not None:
            kind = "permission_error" if adapter_refusal.status == 403 else "invalid_request_error"
            await self._error(
                send, adapter_refusal.status, adapter_refusal.code,
                f"{adapter_refusal.field}: {adapter_refusal.reason}.", kind, param=adapter_refusal.field,
            )  # fmt: skip
            return
        verdict, budget_field = self._rate(tenant, checked.obj)
        if verdict is not None and not verdict.admitted:
            await self._rate_refusal(send, tenant, verdict, budget_field, str(scope.get("path", "")))
            return
        slot: _Slot | None = None
        if self.admission is not None:
            if not await self.admission.acquire(tenant, _gone(receive)):
                if verdict is not None and self.rates is not None:
                    self.rates.undo(tenant, verdict)
                limit = self.admission.limit(tenant)
                _refused("tenant_concurrency", str(scope.get("path", "")), tenant=tenant)
                retry = [(b"retry-after", str(RETRY_AFTER_S).encode()), *self._rate_headers(tenant)]
                await self._error(
                    send, 429, "too_many_requests", f"Too many requests in flight for this key (limit {limit}).",
                    "rate_limit_error", headers=retry,
                )  # fmt: skip
                return
            slot = _Slot(self.admission, tenant)
        scope.setdefault("state", {})[STATE_TENANT] = tenant
        if asked is not None:
            scope["state"][STATE_CACHE_TTL] = asked
        app_receive, app_send = _replay(checked.body, receive), send
        meter: _Meter | None = None
        if verdict is not None and self.rates is not None:
            meter = _Meter(self.rates, tenant, verdict.reserved_tokens)
            app_send = meter.track_send(app_send)
        if slot is not None:
            # NOTE: the slot is given back when the response's last byte is sent or the client goes away, not when
            # SGLang's handler returns: after a disconnect SGLang may keep the handler waiting for seconds.
            app_receive, app_send = slot.track_receive(app_receive), slot.track_send(app_send)
        try:
            await self.app(scope, app_receive, app_send)
        finally:
            if slot is not None:
                slot.release()
            if meter is not None:
                meter.settle()

    def _is_internal(self, key: str) -> bool:
        own = self.internal_key
        return own is not None and hmac.compare_digest(key.encode(), own.encode())

    def _rate(self, tenant: str, obj: dict[str, Any] | None) -> tuple[Verdict | None, str]:
        """Charge ``tenant``'s rate limits for one checked body (its reservation: :mod:`.rate_limits`); the verdict
        and the body's budget field; no verdict for a tenant without rate limits."""
        limits = self.rates.limits(tenant) if self.rates is not None else None
        if self.rates is None or limits is None or not limits.any:
            return None, ""
        tokens, field = 0, ""
        if limits.tokens_per_minute is not None:
            obj = obj if obj is not None else {}
            tokens, field = rate_limits.reservation(obj, self.count_tokens), rate_limits.budget_field(obj)
        return self.rates.admit(tenant, tokens), field

    def _rate_headers(self, tenant: str) -> list[tuple[bytes, bytes]]:
        return self.rates.headers(tenant) if self.rates is not None else []

    async def _rate_refusal(self, send: Send, tenant: str, verdict: Verdict, budget_field: str, path: str) -> None:
        limits = self.rates.limits(tenant) if self.rates is not None else rate_limits.RateLimits()
        _refused(f"tenant_{verdict.limit}_per_minute", path, tenant=tenant)
        if math.isinf(verdict.retry_after_s):
            await self._error(
                send, 400, "request_too_large",
                f"This request needs more tokens (prompt plus output budget) than this key's tokens_per_minute "
                f"limit ({limits.tokens_per_minute}); lower {budget_field} or shorten the prompt.",
                param=budget_field, headers=self._rate_headers(tenant),
            )  # fmt: skip
            return
        size = limits.requests_per_minute if verdict.limit == "requests" else limits.tokens_per_minute
        wait = max(1, math.ceil(verdict.retry_after_s))
        await self._error(
            send, 429, "rate_limit_exceeded",
            f"Rate limit reached for {verdict.limit} per minute (limit {size}); retry in {wait} s.",
            "rate_limit_error",
            headers=[
                (b"retry-after", str(wait).encode()),
                (b"retry-after-ms", str(math.ceil(verdict.retry_after_s * 1000)).encode()),
                *self._rate_headers(tenant),
            ],
        )  # fmt: skip

    async def _refuse_socket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a WebSocket handshake (403 to the client) and anything else that is not HTTP."""
        self.rejected += 1
        _refused("socket_refused", str(scope.get("path", "")))
        if scope.get("type") == "websocket":
            message = await receive()
            if message.get("type") == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008, "reason": "not offered by this server"})

    async def _receive_body(self, scope: Scope, receive: Receive, send: Send, reader: str) -> bytes | None:
        """The request's body; None once the refusal is sent: 429 when ``reader`` (a tenant, or the router) has
        :attr:`max_body_reads` bodies arriving already, 408 when this one takes over :attr:`body_timeout_s`,
        413 when it is over :data:`MAX_BODY_BYTES`."""
        if self._reading.get(reader, 0) >= self.max_body_reads:
            _refused("body_reads", str(scope.get("path", "")), reader)
            await self._error(
                send, 429, "too_many_connections",
                f"More than {self.max_body_reads} request bodies of this key are arriving at once.",
                "rate_limit_error", headers=[(b"retry-after", b"1")],
            )  # fmt: skip
            return None
        self._reading[reader] = self._reading.get(reader, 0) + 1
        try:
            body = await _within(self.body_timeout_s, _read_body(receive))
        except (TimeoutError, asyncio.TimeoutError):  # (one class from Python 3.11 on)
            _refused("body_timeout", str(scope.get("path", "")), reader)
            await self._error(
                send, 408, "body_timeout", f"The request body did not arrive within {self.body_timeout_s:g} s."
            )
            return None
        finally:
            left = self._reading[reader] - 1
            if left:
                self._reading[reader] = left
            else:
                del self._reading[reader]
        if body is None:
            await self._error(send, 413, "body_too_large", f"Request body larger than {MAX_BODY_BYTES} bytes.")
        return body

    async def _error(
        self,
        send: Send,
        status: int,
        code: str,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.rejected += 1
        payload = json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    *(headers or []),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class _Slot:
    """One admitted request's slot, given back exactly once."""

    def __init__(self, admission: Admission, tenant: str) -> None:
        self.admission = admission
        self.tenant = tenant
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.admission.release(self.tenant)

    def track_send(self, send: Send) -> Send:
        async def tracked(message: Message) -> None:
            try:
                await send(message)
            finally:
                if message.get("type") == "http.response.body" and not message.get("more_body", False):
                    self.release()

        return tracked

    def track_receive(self, receive: Receive) -> Receive:
        async def tracked() -> Message:
            message = await receive()
            if message.get("type") == "http.disconnect":
                self.release()
            return message

        return tracked


class _Meter:
    """One rate-limited request's response: adds the ``x-ratelimit-*`` headers, reads the token counts it reports
    (:func:`~sglang_iso.server.rate_limits.used_tokens`) and settles the reservation once."""

    MAX_JSON_BYTES = 4 * 1024 * 1024
    """A non-streamed body larger than this is not parsed: the reservation stands."""

    def __init__(self, rates: RateLimiter, tenant: str, reserved: int) -> None:
        self.rates = rates
        self.tenant = tenant
        self.reserved = reserved
        self.status = 0
        self.stream = False
        self.body = bytearray()
        self.payloads: list[object] = []
        self.settled = False

    def track_send(self, send: Send) -> Send:
        async def tracked(message: Message) -> None:
            kind = message.get("type")
            if kind == "http.response.start":
                self.status = int(message.get("status", 0))
                headers = list(message.get("headers", []))
                self.stream = any(
                    k.lower() == b"content-type" and b"event-stream" in bytes(v).lower() for k, v in headers
                )
                message = {**message, "headers": [*headers, *self.rates.headers(self.tenant)]}
            elif kind == "http.response.body":
                self._read(bytes(message.get("body", b"")), message.get("more_body", False))
            await send(message)

        return tracked

    def _read(self, chunk: bytes, more: bool) -> None:
        if self.reserved == 0 or len(self.body) > self.MAX_JSON_BYTES:
            return
        self.body += chunk
        if self.stream:  # NOTE: server-sent events; only whole lines are parsed, a split one waits for the rest
            lines, _, rest = bytes(self.body).rpartition(b"\n")
            self.body = bytearray(rest)
            for line in lines.split(b"\n"):
                if line.startswith(b"data:") and b"_tokens" in line:
                    self._parse(line[5:])
        elif not more:
            self._parse(bytes(self.body))

    def _parse(self, data: bytes) -> None:
        with contextlib.suppress(ValueError, RecursionError):
            self.payloads.append(orjson.loads(data))

    def settle(self) -> None:
        if self.settled or self.reserved == 0:
            return
        self.settled = True
        # NOTE: an error status means SGLang generated nothing; a response without counts keeps its reservation.
        used = 0 if self.status >= 400 else rate_limits.used_tokens(self.payloads)
        self.rates.settle(self.tenant, self.reserved, used)


def _gone(receive: Receive) -> Callable[[], Awaitable[object]]:
    """Returns when the client disconnects (the body was read already: the next message is the disconnect)."""

    async def wait() -> object:
        message = await receive()
        if message.get("type") != "http.disconnect":
            await asyncio.Event().wait()  # NOTE: not a disconnect: nothing more will come, wait for the slot
        return message

    return wait


def _text_format(scope: Scope) -> Scope:
    """``scope`` with its Accept header replaced by :data:`METRICS_ACCEPT`."""
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept"]
    return {**scope, "headers": [*headers, (b"accept", METRICS_ACCEPT)]}


def _refused(reason: str, path: str, tenant: str | None = None) -> None:
    m = observability.metrics()
    if m is not None:
        m["auth_failures"].labels(reason=reason).inc()
    observability.audit("auth_failure", reason=reason, path=path, tenant=tenant)


async def _within(seconds: float, reading: Awaitable[bytes | None]) -> bytes | None:
    """``reading``, cancelled after ``seconds`` (TimeoutError). NOTE: ``asyncio.timeout`` where there is one: a
    timer on the running task, where ``wait_for`` makes a task of each request's body read."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await reading
    return await asyncio.wait_for(reading, seconds)


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive_more: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then the connection's own messages (disconnects)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive_more()

    return receive
