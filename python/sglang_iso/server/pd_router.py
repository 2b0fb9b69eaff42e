"""``sglang-iso router --pd-disaggregation --tenants-file FILE ...``: the PD router as a trusted client.

sglang-router pairs a prefill and a decode worker per request and adds the
``bootstrap_*`` fields, but it forwards the client's ``Authorization`` header
as it came, or (with its ``--api-key``) replaces it with one shared key: either
way the workers could not tell the router from a tenant, or a tenant from
another. So sglang-iso runs it behind its own front gate::

    client --tenant key--> front gate (this module, --host/--port)
                             | tenant authenticated, body rules, request ids "<tenant>.<id>"
                             | (in the body and as X-Request-ID), n > 1 split into one request per sample
                             v  Authorization: Bearer <router key>
                           sglang-router (127.0.0.1, a free port, --api-key <router key>)
                             | adds bootstrap_host/port/room, keeps the request ids
                             v  Authorization: Bearer <router key>
                           prefill + decode workers: the gate accepts bootstrap fields from the
                           router key only, for the tenant the request ids name (server/pd_rules.py)

The router key comes from the environment variable named by ``--router-key-env``
(default ``SGLANG_ISO_ROUTER_KEY``); its SHA-256 must be listed as
``router_key_sha256`` in the tenants file that every worker loads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import uuid
from typing import Any

from sglang_iso import envvars, settings
from sglang_iso.server import pd_samples
from sglang_iso.server.gate import STATE_TENANT, Message, Receive, ReloadableKeys, Scope, Send, TenantGate
from sglang_iso.server.pd_rules import ROUTER_TENANT_PATHS, parallel_samples

logger = logging.getLogger(__name__)

# Admin-key reads the front gate passes on to sglang-router (readiness and worker health).
ADMIN_PASS_PATHS = frozenset({"/workers"})


def router_front_argv(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang-iso router", add_help=False, allow_abbrev=False)
    parser.add_argument("--tenants-file", required=True)
    parser.add_argument("--router-key-env", default=envvars.ROUTER_KEY.name)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    ours, rest = parser.parse_known_args(argv)
    ours.rest = rest
    return ours


def run(argv: list[str]) -> int:
    """Start sglang-router on a loopback port and serve the front gate until interrupted.

    Raises:
        SystemExit: the router key is missing or is not a ``router_key_sha256`` of the tenants file.
    """
    import uvicorn

    from sglang_iso.tenancy.config import load_tenants_file
    from sglang_iso.tenancy.keys import KeyIndex

    ours = router_front_argv(argv)
    config = load_tenants_file(ours.tenants_file)
    index = KeyIndex(config)
    key = os.environ.get(ours.router_key_env, "")  # NOTE: the variable's name is an option (default ROUTER_KEY)
    principal = index.lookup(key) if key else None
    if principal is None or not principal.is_router:
        raise SystemExit(
            f"sglang-iso router: environment variable {ours.router_key_env} must hold a key whose SHA-256 is listed "
            f"as router_key_sha256 in {ours.tenants_file}"
        )
    try:
        limits = settings.current()
    except settings.SettingsError as exc:
        raise SystemExit(f"sglang-iso router: {exc}") from None
    inner = _loopback_port()
    # NOTE: sglang-router takes its key only on the command line; it listens on loopback only.
    launcher = "import sys; from sglang_iso.cli import run_plain_router; sys.exit(run_plain_router(sys.argv[1:]))"
    cmd = [sys.executable, "-c", launcher, "--host", "127.0.0.1", "--port", str(inner), "--api-key", key,
           *ours.rest]  # fmt: skip
    router = subprocess.Popen(cmd)
    try:
        app = TenantGate(
            RouterProxy(f"http://127.0.0.1:{inner}", key),
            ReloadableKeys(index),
            body_timeout_s=limits.body_timeout_s,
            max_body_reads=limits.max_body_reads,
        )
        uvicorn.run(app, host=ours.host, port=ours.port, log_level="warning")
    finally:
        router.terminate()
        try:
            router.wait(timeout=10)
        except subprocess.TimeoutExpired:
            router.kill()
    return 0


class RouterProxy:
    """ASGI app behind the front gate: forwards tenant generation (and admin reads) to sglang-router.

    Every tenant request carries its request id twice: in the body, and as ``X-Request-ID`` (sglang-router drops
    the body's id of a chat request and forwards the header). An OpenAI request with ``n > 1`` goes out as one
    request per sample and comes back merged (:mod:`sglang_iso.server.pd_samples`).
    """

    def __init__(self, upstream: str, router_key: str) -> None:
        self.upstream = upstream
        self.router_key = router_key
        self._session: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            return
        path = str(scope.get("path", ""))
        if path == "/health":  # NOTE: the front gate's own liveness; worker health is GET /workers (admin key)
            await _reply(send, 200, {"status": "ok"})
            return
        tenant = scope.get("state", {}).get(STATE_TENANT)
        if not (path in ROUTER_TENANT_PATHS and tenant) and path not in ADMIN_PASS_PATHS:
            await _reply(
                send, 404, {"error": {"message": f"{path} is not offered by the PD router", "code": "not_found"}}
            )
            return
        body = b""
        while True:
            message: Message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        obj = _json_object(body) if tenant else None
        if obj is None:
            await self._forward(scope, path, body, send)
            return
        rid = with_tenant_rids(obj, str(tenant))
        field, samples = parallel_samples(obj)
        if path not in pd_samples.SAMPLE_PATHS and samples > 1:
            why = "must be 1 through the PD router (send one request per sample)"
            await _reply(send, 400, {"error": {"message": f"Field {field!r} {why}.", "type": "invalid_request_error",
                                               "param": field, "code": "invalid_field"}})  # fmt: skip
            return
        samples = pd_samples.sample_count(path, obj)
        if samples > 1:
            await self._fan_out(scope, path, obj, samples, send)
            return
        await self._forward(scope, path, json.dumps(obj).encode(), send, rid=_first(rid))

    async def _forward(self, scope: Scope, path: str, body: bytes, send: Send, rid: str | None = None) -> None:
        import aiohttp

        try:
            async with self._request(scope, path, body, rid) as resp:
                ctype = resp.headers.get("content-type", "application/json").encode("latin-1")
                await send(
                    {"type": "http.response.start", "status": resp.status, "headers": [(b"content-type", ctype)]}
                )
                async for chunk in resp.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        except aiohttp.ClientError as exc:
            logger.warning("sglang-iso router: upstream error: %s", exc)
            await _reply(send, 502, _UNREACHABLE)

    async def _fan_out(self, scope: Scope, path: str, obj: dict[str, Any], samples: int, send: Send) -> None:
        """One request per sample, all at once; the first failing sample's answer is the client's answer."""
        import aiohttp

        rid: str | list[str] = obj["rid"]
        subs = pd_samples.split(obj, samples, rid)
        response_id = _first(rid) or ""
        async with contextlib.AsyncExitStack() as stack:
            try:
                requests = [self._request(scope, path, json.dumps(sub).encode(), _first(sub["rid"])) for sub in subs]
                responses = await asyncio.gather(*(stack.enter_async_context(r) for r in requests))
                failed = next((r for r in responses if r.status != 200), None)
                if failed is not None:
                    ctype = failed.headers.get("content-type", "application/json").encode("latin-1")
                    payload = await failed.read()
                    await send({"type": "http.response.start", "status": failed.status,
                                "headers": [(b"content-type", ctype)]})  # fmt: skip
                    await send({"type": "http.response.body", "body": payload})
                    return
                if not obj.get("stream"):
                    answers = await asyncio.gather(*(r.json(content_type=None) for r in responses))
                    await _reply(send, 200, pd_samples.merge(list(answers), response_id))
                    return
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
                merger = pd_samples.StreamMerger(samples, response_id)
                events: asyncio.Queue[bytes | None] = asyncio.Queue()
                pumps = [asyncio.create_task(_pump(i, r, merger, events)) for i, r in enumerate(responses)]
                ended = 0
                while ended < samples:
                    event = await events.get()
                    if event is None:
                        ended += 1
                    else:
                        await send({"type": "http.response.body", "body": event, "more_body": True})
                await asyncio.gather(*pumps)
                await send({"type": "http.response.body", "body": b"".join(merger.finish())})
            except aiohttp.ClientError as exc:
                logger.warning("sglang-iso router: upstream error: %s", exc)
                await _reply(send, 502, _UNREACHABLE)

    def _request(self, scope: Scope, path: str, body: bytes, rid: str | None) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        headers = {"authorization": f"Bearer {self.router_key}", "content-type": "application/json"}
        if rid is not None:
            headers["x-request-id"] = rid
        query = scope.get("query_string", b"").decode("latin-1")
        url = self.upstream + path + (f"?{query}" if query else "")
        return self._session.request(scope.get("method", "POST"), url, data=body, headers=headers)


_UNREACHABLE = {"error": {"message": "the PD router is not reachable", "code": "bad_gateway"}}


def with_tenant_rids(obj: dict[str, Any], tenant: str) -> str | list[str]:
    """The request's id(s); a request without one gets one per prompt in ``tenant``'s id space.

    Mutates: ``obj["rid"]`` when the request has no ``rid`` (the gate already prefixed ids the client gave).
    """
    given = obj.get("rid", obj.get("request_id"))
    if isinstance(given, str) or (isinstance(given, list) and given and all(isinstance(r, str) for r in given)):
        obj["rid"] = given
        return given
    text = obj.get("text", obj.get("input_ids"))
    batch = isinstance(text, list) and bool(text) and (isinstance(text[0], str | list))
    fresh = [f"{tenant}.{uuid.uuid4().hex}" for _ in range(len(text) if batch and isinstance(text, list) else 1)]
    obj["rid"] = fresh if batch else fresh[0]
    return obj["rid"]  # type: ignore[no-any-return]


async def _pump(sample: int, resp: Any, merger: pd_samples.StreamMerger, events: asyncio.Queue[bytes | None]) -> None:
    try:
        async for raw in resp.content:
            event = merger.line(sample, raw)
            if event is not None:
                await events.put(event)
    finally:
        await events.put(None)


def _first(rid: object) -> str | None:
    value = rid[0] if isinstance(rid, list) and rid else rid
    return value if isinstance(value, str) else None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(body) if body.strip() else {}
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


async def _reply(send: Send, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


def _loopback_port() -> int:
    """A free TCP port on 127.0.0.1 for sglang-router (only the front gate listens beyond it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
