"""The HTTP gate: every request is authenticated and sanitized before SGLang sees it.

A pure ASGI middleware (no Starlette base class, so the handler runs in the same
task and sees what the gate records). For each HTTP request:

* ``OPEN_PATHS`` (health probes, Prometheus) pass through.
* Everything else needs ``Authorization: Bearer <key>``; a missing or unknown
  key gets 401 with an OpenAI-style JSON error.
* ``TENANT_PATHS`` (generation, embeddings, model info) need a tenant key. The
  JSON body is checked: fields that could name another tenant's cache entries,
  sessions or routing are refused with 400 naming the field; a client ``rid`` is
  prefixed with the tenant id. The tenant id is stored in ``scope["state"]``.
* Every other path (flush, abort, adapters, weights, profiling, internal state,
  /iso/*) needs an admin key (403 for a tenant key): unknown paths fail closed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from sglang_iso import observability
from sglang_iso.server import adapters
from sglang_iso.tenancy.keys import KeyIndex, Principal, parse_bearer

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

STATE_TENANT = "sglang_iso_tenant"

OPEN_PATHS = frozenset({"/health", "/health_generate", "/metrics"})

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

# Body fields a tenant may not send, and why (README lists them).
FORBIDDEN_FIELDS: dict[str, str] = {
    "extra_key": "the cache namespace is set by the server",
    "mm_hashes": "multimodal hashes key shared caches",
    "kv_hints": "KV placement hints address cache entries",
    "session_params": "sessions splice other requests' tokens",
    "routed_dp_rank": "routing is decided by the server",
    "data_parallel_rank": "routing is decided by the server",
    "bootstrap_host": "disaggregation transfer is server-internal",
    "bootstrap_port": "disaggregation transfer is server-internal",
    "bootstrap_room": "disaggregation transfer is server-internal",
    "bootstrap_pair_key": "disaggregation transfer is server-internal",
    "custom_logit_processor": "server-side code execution is not offered to tenants",
    "previous_response_id": "stored responses are not partitioned by tenant",
}
# Headers a tenant may not send.
FORBIDDEN_HEADERS: dict[str, str] = {
    "x-data-parallel-rank": "routing is decided by the server",
}
MAX_BODY_BYTES = 64 * 1024 * 1024


class KeyLookup(Protocol):
    def lookup(self, presented_key: str) -> Principal | None: ...


class ReloadableKeys:
    """A :class:`KeyIndex` that can be swapped atomically (tenants-file reload on SIGHUP)."""

    def __init__(self, index: KeyIndex) -> None:
        self.index = index

    def lookup(self, presented_key: str) -> Principal | None:
        return self.index.lookup(presented_key)

    def swap(self, index: KeyIndex) -> None:
        self.index = index  # one reference assignment: a request sees the old or the new index, never a mix


class TenantGate:
    """ASGI middleware enforcing tenant authentication (see module doc).

    ``keys`` is consulted on every request, so swapping its index (config
    reload) takes effect for the next request without touching requests in flight.
    """

    def __init__(self, app: ASGIApp, keys: KeyLookup) -> None:
        self.app = app
        self.keys = keys
        self.rejected = 0  # requests refused (401/403/400)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        principal = None
        key = parse_bearer(headers.get("authorization"))
        if key is not None:
            principal = self.keys.lookup(key)
        if principal is None:
            _refused("missing_key" if key is None else "unknown_key", path)
            await self._error(send, 401, "invalid_api_key", "Missing or unknown API key.", "authentication_error")
            return
        if path not in TENANT_PATHS:
            if not principal.is_admin:
                _refused("admin_required", path, tenant=principal.tenant_id)
                await self._error(send, 403, "admin_required", f"{path} needs an admin key.", "permission_error")
                return
            observability.audit("admin_action", method=scope.get("method"), path=path)
            await self.app(scope, receive, send)
            return
        if principal.is_admin or principal.tenant_id is None:
            _refused("tenant_key_required", path)
            await self._error(
                send, 403, "tenant_key_required", "Generation needs a tenant key, not an admin key.", "permission_error"
            )
            return
        tenant = principal.tenant_id
        for header, why in FORBIDDEN_HEADERS.items():
            if header in headers:
                await self._error(
                    send, 400, "forbidden_header", f"Header {header!r} is not allowed: {why}.", param=header
                )
                return
        if scope.get("method") == "POST":
            body = await _read_body(receive)
            if body is None:
                await self._error(send, 413, "body_too_large", "Request body too large.")
                return
            refusal = adapters.check_body_bytes(principal.adapters, body)
            if refusal is not None:
                kind = "permission_error" if refusal.status == 403 else "invalid_request_error"
                await self._error(send, refusal.status, refusal.code, f"{refusal.field}: {refusal.reason}.", kind,
                                  param=refusal.field)  # fmt: skip
                return
            checked = self._check_body(body, tenant)
            if isinstance(checked, tuple):
                field, why = checked
                await self._error(send, 400, "forbidden_field", f"Field {field!r} is not allowed: {why}.", param=field)
                return
            receive = _replay(checked, receive)
        scope.setdefault("state", {})[STATE_TENANT] = tenant
        await self.app(scope, receive, send)

    def _check_body(self, body: bytes, tenant: str) -> bytes | tuple[str, str]:
        """The body to forward, or ``(field, reason)`` for a refused field."""
        try:
            obj = json.loads(body) if body else None
        except ValueError:
            return body  # SGLang answers malformed JSON with its own 400
        if not isinstance(obj, dict):
            return body
        for field, why in FORBIDDEN_FIELDS.items():
            if obj.get(field) is not None:
                return field, why
        rid = obj.get("rid")
        if rid is None:
            return body
        if isinstance(rid, str):
            obj["rid"] = f"{tenant}.{rid}"
        elif isinstance(rid, list) and all(isinstance(r, str) for r in rid):
            obj["rid"] = [f"{tenant}.{r}" for r in rid]
        else:
            return "rid", "must be a string or a list of strings"
        return json.dumps(obj).encode()

    async def _error(
        self,
        send: Send,
        status: int,
        code: str,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
    ) -> None:
        self.rejected += 1
        payload = json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _refused(reason: str, path: str, tenant: str | None = None) -> None:
    m = observability.metrics()
    if m is not None:
        m["auth_failures"].labels(reason=reason).inc()
    observability.audit("auth_failure", reason=reason, path=path, tenant=tenant)


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
