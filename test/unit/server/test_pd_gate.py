"""The gate on a prefill/decode worker: only the router's key may set bootstrap fields, for one tenant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sglang_iso.server.gate import STATE_TENANT, TenantGate
from sglang_iso.server.pd_rules import PdRole, pd_role, router_tenant
from sglang_iso.tenancy.config import load_tenants_file
from sglang_iso.tenancy.keys import KeyIndex, Principal, new_api_key
from sglang_iso_testing.tenants import write_tenants_file

from .test_gate import call, recording_app

KEYS = {"acme": new_api_key(), "globex": new_api_key(), "admin": new_api_key(), "router": new_api_key()}
BOOT = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 12345}


def _gate(tmp_path: Path, role: PdRole | None) -> tuple[TenantGate, list[dict[str, Any]]]:
    made = write_tenants_file(tmp_path, ["acme", "globex"], keys=dict(KEYS), router=True)
    app, seen = recording_app()
    return TenantGate(app, KeyIndex(load_tenants_file(made.path)), pd=role), seen


@pytest.fixture()
def decode(tmp_path: Path) -> tuple[TenantGate, list[dict[str, Any]]]:
    return _gate(tmp_path, PdRole("decode", "mooncake"))


def test_router_key_is_its_own_principal(tmp_path: Path) -> None:
    _gate(tmp_path, None)
    index = KeyIndex(load_tenants_file(tmp_path / "tenants.toml"))
    assert index.lookup(KEYS["router"]) == Principal.for_router()
    assert index.tenant("acme") == Principal.for_tenant("acme") and index.tenant("nobody") is None


def test_tenant_without_bootstrap_gets_400_naming_the_field(decode) -> None:  # type: ignore[no-untyped-def]
    g, seen = decode
    status, out, _ = call(g, "/generate", {"text": "hi"}, key=KEYS["acme"])
    assert status == 400 and out["error"]["param"] == "bootstrap_host"
    status, out, _ = call(g, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, key=KEYS["acme"])
    assert status == 400 and out["error"]["param"] == "bootstrap_host"
    assert not seen


def test_tenant_may_not_set_bootstrap_fields(decode) -> None:  # type: ignore[no-untyped-def]
    g, seen = decode
    status, out, _ = call(g, "/generate", {"text": "hi", **BOOT}, key=KEYS["acme"])
    assert status == 400 and out["error"]["code"] == "forbidden_field"
    assert not seen


def test_router_forwards_for_the_tenant_its_rid_names(decode) -> None:  # type: ignore[no-untyped-def]
    g, seen = decode
    status, _, scope = call(g, "/generate", {"text": "hi", "rid": "globex.r1", **BOOT}, key=KEYS["router"])
    assert status == 200 and scope["state"][STATE_TENANT] == "globex"
    forwarded = json.loads(seen[0]["body"])
    assert forwarded["rid"] == "globex.r1" and forwarded["bootstrap_room"] == 12345  # not prefixed twice


CHAT = {"messages": [{"role": "user", "content": "x"}], **BOOT}


def test_router_chat_without_body_id_is_named_by_its_request_id_header(decode) -> None:  # type: ignore[no-untyped-def]
    """sglang-router drops a chat body's ``rid``; the front gate's ``X-Request-ID`` names the tenant instead."""
    g, seen = decode
    status, _, scope = call(g, "/v1/chat/completions", CHAT, key=KEYS["router"], x_request_id="globex.c1")
    assert status == 200 and scope["state"][STATE_TENANT] == "globex"
    assert json.loads(seen[0]["body"])["rid"] == "globex.c1"  # SGLang serves it under the tenant's id
    # The body's own id wins over the header: a header cannot move a request into another tenant.
    body = {**CHAT, "rid": "acme.c2"}
    status, _, scope = call(g, "/v1/chat/completions", body, key=KEYS["router"], x_request_id="globex.c2")
    assert status == 200 and scope["state"][STATE_TENANT] == "acme" and json.loads(seen[1]["body"])["rid"] == "acme.c2"


@pytest.mark.parametrize("header", ["", "nobody.c1", "no-dot", "acme.\x00" * 80, "g" * 600])
def test_router_request_id_header_must_name_a_tenant(decode, header: str) -> None:  # type: ignore[no-untyped-def]
    g, seen = decode
    status, out, _ = call(g, "/v1/chat/completions", CHAT, key=KEYS["router"], x_request_id=header)
    assert status == 400 and out["error"]["param"] == "rid", out
    assert not seen


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {**CHAT, "rid": "acme.n", "n": 2}, "n"),
        ("/v1/completions", {"prompt": "x", "rid": "acme.n", "n": 3, **BOOT}, "n"),
        ("/generate", {"text": "x", "rid": "acme.n", "sampling_params": {"n": 2}, **BOOT}, "sampling_params.n"),
    ],
)
def test_parallel_samples_are_refused_on_a_worker(decode, path: str, body: dict[str, Any], field: str) -> None:  # type: ignore[no-untyped-def]
    """SGLang gives every sample one transfer room: the pair would hang until the router's timeout."""
    g, seen = decode
    status, out, _ = call(g, path, body, key=KEYS["router"])
    assert status == 400 and out["error"]["param"] == field, out
    assert call(g, path, {**body, "n": 1, "sampling_params": {"n": 1}}, key=KEYS["router"])[0] == 200  # one sample
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text": "hi", **BOOT}, "rid"),  # no tenant named
        ({"text": "hi", "rid": "nobody.r1", **BOOT}, "rid"),  # unknown tenant
        ({"text": ["a", "b"], "rid": ["acme.1", "globex.2"], **BOOT}, "rid"),  # two tenants in one batch
        ({"text": "hi", "rid": "acme.r1", "bootstrap_host": "127.0.0.1"}, "bootstrap_room"),
        ({"text": "hi", "rid": "acme.r1", **BOOT, "bootstrap_room": -1}, "bootstrap_room"),
        ({"text": "hi", "rid": "acme.r1", **BOOT, "bootstrap_room": "7"}, "bootstrap_room"),
        ({"text": "hi", "rid": "acme.r1", **BOOT, "bootstrap_port": 70000}, "bootstrap_port"),
        ({"text": "hi", "rid": "acme.r1", **BOOT, "extra_key": "globex"}, "extra_key"),
    ],
)
def test_router_requests_are_checked(decode, body: dict[str, Any], field: str) -> None:  # type: ignore[no-untyped-def]
    g, seen = decode
    status, out, _ = call(g, "/generate", body, key=KEYS["router"])
    assert status == 400 and out["error"]["param"] == field, out
    assert not seen


def test_router_key_reads_worker_info_but_no_admin_path(decode) -> None:  # type: ignore[no-untyped-def]
    g, _ = decode
    assert call(g, "/server_info", None, key=KEYS["router"], method="GET")[0] == 200
    assert call(g, "/flush_cache", {}, key=KEYS["router"])[0] == 403
    assert call(g, "/iso/tenants", None, key=KEYS["router"], method="GET")[0] == 403


def test_fake_decode_needs_no_bootstrap(tmp_path: Path) -> None:
    g, seen = _gate(tmp_path, PdRole("decode", "fake"))
    assert call(g, "/generate", {"text": "hi"}, key=KEYS["acme"])[0] == 200 and seen


def test_not_disaggregated_is_unchanged(tmp_path: Path) -> None:
    g, _ = _gate(tmp_path, None)
    assert call(g, "/generate", {"text": "hi"}, key=KEYS["acme"])[0] == 200
    assert call(g, "/generate", {"text": "hi", **BOOT}, key=KEYS["acme"])[0] == 400


def test_pd_role_and_router_tenant() -> None:
    assert pd_role("null", "mooncake") is None and pd_role(None, None) is None
    assert pd_role("prefill", None) == PdRole("prefill", "mooncake")
    assert not PdRole("decode", "fake").needs_bootstrap and PdRole("prefill", "fake").needs_bootstrap
    assert router_tenant({"rid": ["a.1", "a.2"]}) == "a"
