"""The PD router's front gate: request ids in the tenant's space, nothing but generation forwarded."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sglang_iso.server.gate import STATE_TENANT
from sglang_iso.server.pd_router import RouterProxy, router_front_argv, with_tenant_rids


def test_missing_rids_are_made_in_the_tenant_space() -> None:
    one = json.loads(with_tenant_rids(b'{"text": "hi"}', "acme"))
    assert one["rid"].startswith("acme.") and len(one["rid"]) > len("acme.")
    batch = json.loads(with_tenant_rids(b'{"text": ["a", "b"]}', "acme"))
    assert len(batch["rid"]) == 2 and all(r.startswith("acme.") for r in batch["rid"])
    ids = json.loads(with_tenant_rids(b'{"input_ids": [1, 2, 3]}', "acme"))
    assert isinstance(ids["rid"], str)
    given = b'{"text": "hi", "rid": "acme.mine"}'
    assert with_tenant_rids(given, "acme") == given  # the gate already prefixed it
    assert with_tenant_rids(b"not json", "acme") == b"not json"


def _call(proxy: RouterProxy, path: str, tenant: str | None) -> tuple[int, Any]:
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "path": path, "method": "POST", "state": {STATE_TENANT: tenant} if tenant else {}}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(proxy(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_only_generation_and_health_are_served() -> None:
    proxy = RouterProxy("http://127.0.0.1:9", "sk-iso-router")  # nothing listens: never reached here
    assert _call(proxy, "/health", None)[0] == 200
    assert _call(proxy, "/flush_cache", None)[0] == 404
    assert _call(proxy, "/generate", None)[0] == 404  # no tenant recorded by the gate
    assert _call(proxy, "/generate", "acme")[0] == 502  # forwarded; the upstream is down


def test_front_arguments_split_from_the_router_flags() -> None:
    ours = router_front_argv(["--tenants-file", "t.toml", "--port", "9", "--pd-disaggregation", "--decode", "u"])
    assert ours.tenants_file == "t.toml" and ours.port == 9 and ours.host == "127.0.0.1"
    assert ours.rest == ["--pd-disaggregation", "--decode", "u"]
