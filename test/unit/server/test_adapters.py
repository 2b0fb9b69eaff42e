"""Adapter allow-lists: the pure body check, the gate's 403, and adapter content hashes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from sglang_iso.server import adapters
from sglang_iso.server.gate import TenantGate
from sglang_iso.tenancy.config import load_tenants_file
from sglang_iso.tenancy.keys import KeyIndex, new_api_key
from sglang_iso_testing.tenants import write_tenants_file

ALLOWED = frozenset({"acme-support", "acme-legal"})


@pytest.mark.parametrize(
    "body",
    [
        {"text": "x"},
        {"text": "x", "lora_path": None},
        {"text": "x", "lora_path": ""},
        {"text": "x", "lora_path": "acme-support"},
        {"text": ["x", "y", "z"], "lora_path": ["acme-support", None, "acme-legal"]},
    ],
)
def test_allowed_bodies_pass(body: dict[str, Any]) -> None:
    assert adapters.check_body(ALLOWED, body) is None


@pytest.mark.parametrize(
    ("body", "field", "status", "named"),
    [
        ({"lora_path": "globex-private"}, "lora_path", 403, "globex-private"),
        ({"lora_path": ["acme-support", "globex-private"]}, "lora_path", 403, "globex-private"),
        ({"lora_path": 7}, "lora_path", 400, None),
        ({"lora_path": ["acme-support", 7]}, "lora_path", 400, None),
        ({"lora_path": {"a": 1}}, "lora_path", 400, None),
        ({"lora_id": "0" * 32}, "lora_id", 400, None),
        ({"lora_id": "0" * 32, "lora_path": "acme-support"}, "lora_id", 400, None),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], field: str, status: int, named: str | None) -> None:
    refusal = adapters.check_body(ALLOWED, body)
    assert refusal is not None
    assert (refusal.field, refusal.status) == (field, status)
    if named is not None:
        assert repr(named) in refusal.reason


def test_no_adapters_allowed_by_default() -> None:
    refusal = adapters.check_body(frozenset(), {"lora_path": "acme-support"})
    assert refusal is not None and refusal.status == 403


def test_content_hash_tracks_names_and_bytes(tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.mkdir()
    (one / "adapter_config.json").write_text('{"r": 8}')
    (one / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    first = adapters.content_hash(str(one))
    assert first is not None and len(first) == 64
    assert adapters.content_hash(str(one)) == first  # deterministic
    two = tmp_path / "two"
    two.mkdir()
    for f in one.iterdir():
        (two / f.name).write_bytes(f.read_bytes())
    assert adapters.content_hash(str(two)) == first  # content, not path
    (two / "adapter_model.safetensors").write_bytes(b"\x00" * 63 + b"\x01")  # re-upload, same name
    assert adapters.content_hash(str(two)) != first
    (two / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    (two / "adapter_config.json").rename(two / "adapter_config2.json")
    assert adapters.content_hash(str(two)) != first


def test_content_hash_none_when_not_hashable(tmp_path: Path) -> None:
    assert adapters.content_hash(None) is None
    assert adapters.content_hash(str(tmp_path / "missing")) is None
    assert adapters.content_hash(str(tmp_path)) is None  # no files
    (tmp_path / "f").write_text("x")
    assert adapters.content_hash(str(tmp_path / "f")) is None  # a file, not an adapter folder


# --- wired into the HTTP gate -------------------------------------------------------------------------------------

KEYS = {"acme": new_api_key(), "globex": new_api_key()}


@pytest.fixture()
def gate(tmp_path: Path) -> TenantGate:
    made = write_tenants_file(tmp_path, {"acme": {"adapters": ["acme-support"]}, "globex": {}}, keys=dict(KEYS))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return TenantGate(app, KeyIndex(load_tenants_file(made.path)))


def post(gate: TenantGate, path: str, body: dict[str, Any], key: str) -> tuple[int, Any]:
    raw = json.dumps(body).encode()
    scope = {"type": "http", "path": path, "method": "POST", "headers": [(b"authorization", f"Bearer {key}".encode())]}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    asyncio.run(gate(scope, receive, send))
    status = sent[0]["status"]
    return status, (json.loads(sent[1]["body"]) if status != 200 else None)


def test_gate_lets_a_tenant_use_its_own_adapter(gate: TenantGate) -> None:
    assert post(gate, "/generate", {"text": "x", "lora_path": "acme-support"}, KEYS["acme"])[0] == 200
    assert post(gate, "/v1/completions", {"prompt": "x", "lora_path": "acme-support"}, KEYS["acme"])[0] == 200


@pytest.mark.parametrize(
    ("tenant", "body", "status", "param"),
    [
        ("globex", {"text": "x", "lora_path": "acme-support"}, 403, "lora_path"),  # another tenant's adapter
        ("acme", {"text": "x", "lora_path": "acme-other"}, 403, "lora_path"),  # not on its list
        ("acme", {"text": "x", "lora_id": "f" * 32}, 400, "lora_id"),  # internal id, never from clients
        ("acme", {"text": "x", "lora_path": 3}, 400, "lora_path"),
    ],
)
def test_gate_refuses_adapters_naming_the_field(
    gate: TenantGate, tenant: str, body: dict[str, Any], status: int, param: str
) -> None:
    got, out = post(gate, "/generate", body, KEYS[tenant])
    assert got == status
    assert out["error"]["param"] == param
    assert param in out["error"]["message"]
    if status == 403:
        assert out["error"]["code"] == "adapter_not_allowed"
        assert repr(body["lora_path"]) in out["error"]["message"]
