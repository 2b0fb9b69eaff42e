"""The PD router's front gate: request ids in the tenant's space, nothing but generation forwarded."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sglang_iso.server.gate import STATE_TENANT
from sglang_iso.server.pd_router import RouterProxy, router_front_argv, with_tenant_rids


def test_missing_rids_are_made_in_the_tenant_space() -> None:
    one: dict[str, Any] = {"text": "hi"}
    assert with_tenant_rids(one, "acme") == one["rid"] and one["rid"].startswith("acme.") and len(one["rid"]) > 5
    batch: dict[str, Any] = {"text": ["a", "b"]}
    with_tenant_rids(batch, "acme")
    assert len(batch["rid"]) == 2 and all(r.startswith("acme.") for r in batch["rid"])
    ids: dict[str, Any] = {"input_ids": [1, 2, 3]}
    with_tenant_rids(ids, "acme")
    assert isinstance(ids["rid"], str)
    chat: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
    assert with_tenant_rids(chat, "acme").startswith("acme.")  # type: ignore[union-attr]
    given: dict[str, Any] = {"text": "hi", "rid": "acme.mine"}
    assert with_tenant_rids(given, "acme") == "acme.mine" == given["rid"]  # the gate already prefixed it
    other: dict[str, Any] = {"prompt": "hi", "request_id": "acme.q"}
    assert with_tenant_rids(other, "acme") == "acme.q" == other["rid"]


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


class _Upstream:
    """sglang-router's place: records what the front gate sends, answers like a worker (one choice per prompt)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def start(self) -> Any:
        from aiohttp import web

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            self.seen.append((request.headers.get("x-request-id", ""), body))
            if body.get("n", 1) != 1:
                return web.json_response({"error": "n"}, status=400)
            rid = body["rid"]
            text = f"answer of {rid}"
            if not body.get("stream"):
                usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
                return web.json_response({"id": rid, "choices": [{"index": 0, "text": text}], "usage": usage})
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            for piece in (text[:4], text[4:]):
                await resp.write(b"data: " + json.dumps({"id": rid, "choices": [{"index": 0, "text": piece}]}).encode())
                await resp.write(b"\n\n")
            usage = {"prompt_tokens": 10, "completion_tokens": 3}
            await resp.write(b"data: " + json.dumps({"id": rid, "choices": [], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner


def _exchange(body: dict[str, Any]) -> tuple[_Upstream, list[dict[str, Any]]]:
    upstream = _Upstream()
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        runner = await upstream.start()
        proxy = RouterProxy(f"http://127.0.0.1:{upstream.port}", "sk-iso-router")
        scope = {"type": "http", "path": "/v1/completions", "method": "POST", "state": {STATE_TENANT: "acme"}}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        try:
            await proxy(scope, receive, send)
        finally:
            await proxy._session.close()
            await runner.cleanup()

    asyncio.run(run())
    return upstream, sent


def test_every_request_carries_its_id_as_a_header_too() -> None:
    upstream, sent = _exchange({"prompt": "hi", "rid": "acme.mine"})
    assert sent[0]["status"] == 200 and upstream.seen == [("acme.mine", {"prompt": "hi", "rid": "acme.mine"})]


def test_n_is_one_request_per_sample_merged_in_openai_order() -> None:
    upstream, sent = _exchange({"prompt": "hi", "n": 3, "rid": "acme.mine"})
    expected = [(f"acme.mine_{i}", f"acme.mine_{i}", 1) for i in range(3)]
    assert [(h, b["rid"], b["n"]) for h, b in upstream.seen] == expected
    out = json.loads(sent[1]["body"])
    assert out["id"] == "acme.mine"
    assert [(c["index"], c["text"]) for c in out["choices"]] == [(i, f"answer of acme.mine_{i}") for i in range(3)]
    assert out["usage"] == {"prompt_tokens": 10, "completion_tokens": 9, "total_tokens": 19}


def test_streamed_n_keeps_each_sample_on_its_index_and_ends_once() -> None:
    _, sent = _exchange({"prompt": "hi", "n": 2, "stream": True})
    events = [e for m in sent[1:] for e in m.get("body", b"").split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and events.count(b"data: [DONE]") == 1
    chunks = [json.loads(e[len(b"data: ") :]) for e in events[:-1]]
    texts: dict[int, str] = {}
    for chunk in chunks[:-1]:
        assert chunk["id"].startswith("acme.") and not chunk["id"].endswith(("_0", "_1"))
        texts[chunk["choices"][0]["index"]] = texts.get(chunk["choices"][0]["index"], "") + chunk["choices"][0]["text"]
    assert sorted(texts) == [0, 1] and all(t.startswith("answer of acme.") for t in texts.values())
    assert texts[0].endswith("_0") and texts[1].endswith("_1")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_native_n_is_refused_naming_the_field() -> None:
    upstream = RouterProxy("http://127.0.0.1:9", "sk-iso-router")
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "path": "/generate", "method": "POST", "state": {STATE_TENANT: "acme"}}
    body = {"text": "hi", "sampling_params": {"n": 2}}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(upstream(scope, receive, send))
    assert sent[0]["status"] == 400 and json.loads(sent[1]["body"])["error"]["param"] == "sampling_params.n"
