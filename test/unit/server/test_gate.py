"""The tenant gate as an ASGI component: who gets through, and with what body."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from sglang_iso.server.gate import STATE_TENANT, TenantGate
from sglang_iso.tenancy.config import load_tenants_file
from sglang_iso.tenancy.keys import KeyIndex, key_sha256, new_api_key

KEYS = {"acme": new_api_key(), "admin": new_api_key()}


@pytest.fixture()
def gate(tmp_path: Path) -> tuple[TenantGate, list[dict[str, Any]]]:
    (tmp_path / "s.key").write_bytes(secrets.token_bytes(32))
    (tmp_path / "t.toml").write_text(
        'namespace_secret_file = "s.key"\n'
        f'admin_key_sha256 = ["{key_sha256(KEYS["admin"])}"]\n'
        f'[[tenants]]\nid = "acme"\nkey_sha256 = ["{key_sha256(KEYS["acme"])}"]\n'
    )
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        msg = await receive()
        seen.append({"scope": scope, "body": msg.get("body", b"")})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return TenantGate(app, KeyIndex(load_tenants_file(tmp_path / "t.toml"))), seen


def call(gate: TenantGate, path: str, body: dict | None = None, key: str | None = None, **headers: str):
    raw = json.dumps(body).encode() if body is not None else b""
    hdrs = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    if key:
        hdrs.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "path": path, "method": "POST", "headers": hdrs}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    asyncio.run(gate(scope, receive, send))
    status = sent[0]["status"]
    payload = sent[1]["body"]
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
