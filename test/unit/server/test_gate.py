"""The tenant gate as an ASGI component: who gets through, and with what body."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from sglang_iso.server.gate import CACHE_TTL_HEADER, STATE_CACHE_TTL, STATE_TENANT, TenantGate
from sglang_iso.tenancy.config import load_tenants_file
from sglang_iso.tenancy.keys import KeyIndex, new_api_key
from sglang_iso_testing.tenants import write_tenants_file

KEYS = {"acme": new_api_key(), "admin": new_api_key()}


def recording_app() -> tuple[Any, list[dict[str, Any]]]:
    """An ASGI app behind the gate that answers 200 and records each scope and body it receives."""
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        msg = await receive()
        seen.append({"scope": scope, "body": msg.get("body", b"")})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app, seen


def key_index(tmp_path: Path, *, admin: bool = True, **more: str) -> KeyIndex:
    """Keys of a tenants file with the admin key and tenant ``acme`` (and ``more``: tenant id -> key)."""
    made = write_tenants_file(tmp_path, ["acme", *more], keys={**KEYS, **more}, admin=admin)
    return KeyIndex(load_tenants_file(made.path))


@pytest.fixture()
def gate(tmp_path: Path) -> tuple[TenantGate, list[dict[str, Any]]]:
    app, seen = recording_app()
    return TenantGate(app, key_index(tmp_path)), seen


def call(
    gate: TenantGate,
    path: str,
    body: dict | None = None,
    key: str | None = None,
    *,
    method: str = "POST",
    raw: bytes | None = None,
    **headers: str,
):
    if raw is None:
        raw = json.dumps(body).encode() if body is not None else b""
    hdrs = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    if key:
        hdrs.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "path": path, "method": method, "headers": hdrs}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    asyncio.run(gate(scope, receive, send))
    status = sent[0]["status"]
    payload = sent[1]["body"]
    scope["response_headers"] = dict(sent[0]["headers"])
    return status, (json.loads(payload) if status != 200 else payload), scope


def test_open_paths_need_no_key(gate) -> None:  # type: ignore[no-untyped-def]
    assert call(gate[0], "/health")[0] == 200


def test_unknown_key_401_and_app_never_called(gate) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    status, out, _ = call(g, "/generate", {"text": "x"}, key="sk-iso-wrong")
    assert status == 401 and out["error"]["type"] == "authentication_error"
    assert not seen


def test_tenant_request_is_tagged_with_its_tenant_and_rid_prefixed(gate) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    status, _, scope = call(g, "/generate", {"text": "x", "rid": "r1"}, key=KEYS["acme"])
    assert status == 200
    assert scope["state"][STATE_TENANT] == "acme"
    assert json.loads(seen[0]["body"])["rid"] == "acme.r1"


def test_unlisted_path_needs_admin(gate) -> None:  # type: ignore[no-untyped-def]
    g, _ = gate
    assert call(g, "/some_future_endpoint", {}, key=KEYS["acme"])[0] == 403
    assert call(g, "/some_future_endpoint", {}, key=KEYS["admin"])[0] == 200


def test_forbidden_field_names_the_field(gate) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    status, out, _ = call(g, "/v1/chat/completions", {"messages": [], "extra_key": "globex"}, key=KEYS["acme"])
    assert status == 400 and out["error"]["param"] == "extra_key"
    assert not seen


def test_previous_response_id_is_refused(gate) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    status, out, _ = call(g, "/v1/responses", {"input": "hi", "previous_response_id": "resp_x"}, key=KEYS["acme"])
    assert status == 400 and out["error"]["param"] == "previous_response_id"
    assert not seen


@pytest.mark.parametrize("method", ["PUT", "PATCH", "GET", "DELETE"])
def test_every_method_with_a_body_is_checked(gate, method: str) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    status, out, _ = call(g, "/generate", {"text": "x", "extra_key": "globex"}, key=KEYS["acme"], method=method)
    assert status == 400 and out["error"]["param"] == "extra_key"
    # Positive control: the same method with a clean body passes, rid prefixed.
    status, _, _ = call(g, "/generate", {"text": "x", "rid": "j"}, key=KEYS["acme"], method=method)
    assert status == 200 and json.loads(seen[-1]["body"])["rid"] == "acme.j"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"[" * 990 + b"]" * 990, "invalid_json"),
        (b'{"a":' * 40 + b"1" + b"}" * 40, "invalid_json"),
        (b'[{"role": "user", "content": "hi"}]', "invalid_json"),
        (b'{"text": NaN}', "invalid_json"),
        (b"\xff\xfe not json", "invalid_json"),
    ],
)
def test_malformed_json_is_400_not_500(gate, raw: bytes, code: str) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    status, out, _ = call(g, "/v1/chat/completions", key=KEYS["acme"], raw=raw)
    assert status == 400 and out["error"]["code"] == code
    assert not seen


def test_encoded_bodies_are_refused(gate) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    assert call(g, "/generate", {"text": "x"}, key=KEYS["acme"], content_encoding="zstd")[0] == 415
    assert call(g, "/generate", {"text": "x"}, key=KEYS["acme"], x_body_compressed="zstd")[0] == 400
    assert not seen
    assert call(g, "/generate", {"text": "x"}, key=KEYS["acme"], content_encoding="identity")[0] == 200


def test_websocket_is_refused_before_the_app(gate) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {
        "type": "websocket",
        "path": "/v1/realtime",
        "headers": [(b"authorization", f"Bearer {KEYS['acme']}".encode())],
    }
    asyncio.run(g(scope, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008, "reason": "not offered by this server"}]
    assert not seen


def test_metrics_are_asked_for_in_the_text_format(gate) -> None:  # type: ignore[no-untyped-def]
    """An OpenMetrics scrape (Prometheus 2.x) would get metric names with colons escaped to underscores."""
    g, seen = gate
    openmetrics = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    for key in (None, KEYS["admin"]):
        g.metrics_need_admin = key is not None
        assert call(g, "/metrics", method="GET", key=key, accept=openmetrics)[0] == 200
        accepts = [v for k, v in seen[-1]["scope"]["headers"] if k == b"accept"]
        assert accepts == [b"text/plain; version=0.0.4"], accepts
    # Positive control: other paths keep the client's Accept header.
    assert call(g, "/generate", {"text": "x"}, key=KEYS["acme"], accept="text/event-stream")[0] == 200
    assert [v for k, v in seen[-1]["scope"]["headers"] if k == b"accept"] == [b"text/event-stream"]


def test_metrics_need_the_admin_key_when_asked(gate) -> None:  # type: ignore[no-untyped-def]
    g, _ = gate
    assert call(g, "/metrics", method="GET")[0] == 200  # default: open, as upstream
    g.metrics_need_admin = True
    assert call(g, "/metrics", method="GET")[0] == 401
    assert call(g, "/metrics", method="GET", key=KEYS["acme"])[0] == 403
    assert call(g, "/metrics", method="GET", key=KEYS["admin"])[0] == 200


def test_tenant_over_its_limit_gets_429_with_retry_after(gate) -> None:  # type: ignore[no-untyped-def]
    from sglang_iso.server.admission import Admission

    g, _ = gate
    g.admission = Admission(lambda _t: None, default=1)
    g.admission.in_flight["acme"] = 1  # one request already in flight
    status, out, scope = call(g, "/generate", {"text": "x"}, key=KEYS["acme"])
    assert status == 429 and out["error"]["code"] == "too_many_requests"
    assert scope["response_headers"][b"retry-after"] == b"1"
    g.admission.release("acme")
    # Positive control: with the slot back, the same request passes, and its own slot is released after.
    assert call(g, "/generate", {"text": "x"}, key=KEYS["acme"])[0] == 200
    assert g.admission.in_flight == {}


def test_slot_comes_back_with_the_last_byte_not_when_the_handler_returns(tmp_path: Path) -> None:
    from sglang_iso.server.admission import Admission

    admission = Admission(lambda _t: None, default=1)
    during: list[dict[str, int]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        during.append(dict(admission.in_flight))
        await send({"type": "http.response.body", "body": b"ok"})
        during.append(dict(admission.in_flight))  # SGLang may linger here after a client went away

    g = TenantGate(app, key_index(tmp_path, admin=False), admission=admission)
    assert call(g, "/generate", {"text": "x"}, key=KEYS["acme"])[0] == 200
    assert during == [{"acme": 1}, {}]
    assert admission.in_flight == {}


def test_internal_key_opens_only_the_internal_paths(tmp_path: Path) -> None:
    """The server's own post-start call (``/freeze_gc``) passes with the in-memory key; the key opens nothing else,
    and without it the path stays an admin path."""
    keys = key_index(tmp_path)
    internal = secrets.token_urlsafe(32)
    app, seen = recording_app()
    gate = TenantGate(app, keys, internal_key=internal)

    assert call(gate, "/freeze_gc", key=internal)[0] == 200  # positive control: the server's own call
    assert len(seen) == 1
    for path in ("/flush_cache", "/generate", "/iso/tenants", "/get_server_info"):
        status, payload, _ = call(gate, path, {"text": "x"}, key=internal)
        assert (status, payload["error"]["code"]) == (401, "invalid_api_key"), path
    assert call(gate, "/freeze_gc", key=internal[:-1] + ("A" if internal[-1] != "A" else "B"))[0] == 401
    assert call(gate, "/freeze_gc")[0] == 401
    assert call(gate, "/freeze_gc", key=KEYS["acme"])[0] == 403  # a tenant may not freeze the server's collector
    assert call(gate, "/freeze_gc", key=KEYS["admin"])[0] == 200  # the operator still may
    assert len(seen) == 2

    plain, plain_seen = recording_app()
    no_internal = TenantGate(plain, keys)
    assert call(no_internal, "/freeze_gc", key=internal)[0] == 401
    assert not plain_seen


def test_slow_bodies_time_out_and_a_tenant_trickling_many_starves_no_one(tmp_path: Path) -> None:
    """A body that does not arrive in time gets 408; a tenant's bodies arriving at once are capped (429), per
    tenant: another tenant's request passes meanwhile, and the same tenant is served once its reads end."""
    other = new_api_key()
    app, seen = recording_app()
    g = TenantGate(app, key_index(tmp_path, globex=other), body_timeout_s=0.5, max_body_reads=2)

    async def request(key: str, *, trickle: bool) -> tuple[int, Any]:
        scope = {"type": "http", "path": "/generate", "method": "POST",
                 "headers": [(b"authorization", f"Bearer {key}".encode())]}  # fmt: skip
        sent: list[dict[str, Any]] = []
        parts = [b'{"te', b'xt": "x"}']

        async def receive() -> dict[str, Any]:
            if trickle and len(parts) == 1:
                await asyncio.sleep(3600)  # the rest of the body never comes
            return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        await g(scope, receive, send)
        status = sent[0]["status"]
        return status, json.loads(sent[1]["body"]) if status != 200 else sent[1]["body"]

    async def scenario() -> list[tuple[int, Any]]:
        slow = [asyncio.create_task(request(KEYS["acme"], trickle=True)) for _ in range(2)]
        await asyncio.sleep(0.1)
        over = await request(KEYS["acme"], trickle=False)  # acme's third body while two are arriving
        others = await request(other, trickle=False)  # globex is not held back by acme's slow bodies
        timed_out = [await task for task in slow]
        again = await request(KEYS["acme"], trickle=False)  # positive control: acme's reads ended
        return [over, others, *timed_out, again]

    over, others, first, second, again = asyncio.run(scenario())
    assert over[0] == 429 and over[1]["error"]["code"] == "too_many_connections"
    assert others[0] == 200
    assert first[0] == second[0] == 408 and first[1]["error"]["code"] == "body_timeout"
    assert again[0] == 200 and g._reading == {}
    assert len(seen) == 2  # globex's request and acme's last; no partial body ever reached the app


@pytest.mark.parametrize("value", ["0", "-5", "abc", "1e3", "3.5", "", "\uff11\uff12", "99999999999", str(2**31)])
def test_a_bad_cache_ttl_header_is_400_naming_it(gate, value: str) -> None:  # type: ignore[no-untyped-def]
    g, seen = gate
    status, out, _ = call(g, "/generate", {"text": "x"}, key=KEYS["acme"], x_cache_ttl_seconds=value)
    assert status == 400 and out["error"]["param"] == CACHE_TTL_HEADER, out
    assert not seen
    status, _, scope = call(g, "/generate", {"text": "x"}, key=KEYS["acme"], x_cache_ttl_seconds=" 30 ")  # control
    assert status == 200 and scope["state"][STATE_CACHE_TTL] == 30
    status, _, scope = call(g, "/generate", {"text": "x"}, key=KEYS["acme"])
    assert status == 200 and STATE_CACHE_TTL not in scope["state"]  # no header: nothing asked
