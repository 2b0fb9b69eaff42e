"""sglang-iso's own time per request in the HTTP process, in-process: the tenant gate and the tokenizer-manager hooks.

Usage::

    python benchmark/front_overhead.py [--requests 3000] [--repeats 5] [--chunks 17]

Two measurements, each against the same work without sglang-iso, hot caches, one event loop, no server:

* the gate (``TenantGate`` as the server installs it: keys, the served model's limits, admission, rate limiter) in
  front of a stand-in ASGI app that reads the body and streams ``--chunks`` server-sent events, for a text prompt
  (about 700 words, as generated-shared-prefix sends) and for 512 token ids (as random-ids sends);
* ``tag_and_observe`` (the AROUND hook of ``TokenizerManager.generate_request``: the namespace tag, then the
  observation of each output) around a stand-in generator of ``--chunks`` outputs, the last one finished.

Before timing, one request checks that the gate passes each body through whole and that the hook tags the request
with the tenant's namespace and counts it served (a refusal must not be what gets timed). Each is timed
``--repeats`` times over ``--requests`` requests, alternating with the bare work; the best of the repeats is printed
(the least disturbed by the machine), with the bare time and the difference per request. Inside a serving process the
same code runs with colder caches, so read these as the floor of sglang-iso's share of the HTTP process's CPU per
request (``bench_serving.py`` prints that share as measured under load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_iso import envvars, settings
from sglang_iso.integration.front import request_tags, state
from sglang_iso.integration.front.state import FrontState
from sglang_iso.models import tiny_model_path
from sglang_iso.server.admission import Admission
from sglang_iso.server.gate import STATE_TENANT, ReloadableKeys, TenantGate
from sglang_iso.server.rate_limits import RateLimiter, RateLimits
from sglang_iso.server.request_rules import Limits
from sglang_iso.tenancy.config import load_tenants_file
from sglang_iso.tenancy.keys import KeyIndex, new_api_key
from sglang_iso_testing.tenants import write_tenants_file

_MODEL_CONFIG = json.loads((tiny_model_path() / "config.json").read_text())
VOCAB, CONTEXT = int(_MODEL_CONFIG["vocab_size"]), int(_MODEL_CONFIG["max_position_embeddings"])  # the tiny model's
TENANT = "solo"
ROOMY = {"max_concurrent_requests": 64, "kv_share": 1.0}  # bench_serving.py's tenant

Timed = Callable[[], Awaitable[None]]


def bodies(seed: int) -> dict[str, bytes]:
    """The two request bodies: a text prompt and a prompt of token ids, both streamed, 16 new tokens."""
    rng = random.Random(seed)
    words = "the of and to in is was for on that with as by at from his her an were are which this".split()
    params = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
    text = " ".join(rng.choice(words) for _ in range(700))
    ids = [rng.randrange(VOCAB) for _ in range(512)]
    return {
        "text prompt": json.dumps({"text": text, "sampling_params": params, "stream": True}).encode(),
        "512 token ids": json.dumps({"input_ids": ids, "sampling_params": params, "stream": True}).encode(),
    }


def stand_in_app(chunks: int) -> Callable[..., Awaitable[None]]:
    """An ASGI app that reads the body and streams ``chunks`` events, as SGLang's /generate does."""
    event = b'data: {"text":"x","meta_info":{"id":"a"}}\n\n'

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(chunks):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def asgi_request(app: Any, key: str, body: bytes, seen: list[dict[str, Any]] | None = None) -> Timed:
    """One request to ``app``; ``seen`` (if given) collects what it sent back."""
    auth = f"Bearer {key}".encode()
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"authorization", auth)]

    async def one() -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # (no disconnect: the request runs to its end)
            return {}

        async def send(message: dict[str, Any]) -> None:
            if seen is not None:
                seen.append(message)

        await app({"type": "http", "path": "/generate", "method": "POST", "headers": headers}, receive, send)

    return one


def generate_request(chunks: int, hooked: bool, tags: list[str] | None = None) -> Timed:
    """One request through ``tag_and_observe`` (``hooked``) or straight from the stand-in generator; ``tags`` (if
    given) collects the namespace tag each request got."""
    outputs = [{"text": "x", "meta_info": {"id": "a", "finish_reason": None}} for _ in range(chunks - 1)]
    outputs.append({"text": "x", "meta_info": {"id": "a", "finish_reason": {"type": "length"}, "prompt_tokens": 800,
                                                "cached_tokens": 700}})  # fmt: skip
    request = SimpleNamespace(state=SimpleNamespace(**{STATE_TENANT: TENANT}))

    async def original(_manager: Any, _obj: Any, _request: Any = None) -> Any:
        for out in outputs:
            yield out

    async def one() -> None:
        obj = SimpleNamespace(extra_key=None, cache_salt=None, lora_path=None, lora_id=None)
        gen = request_tags.tag_and_observe(original, None, obj, request) if hooked else original(None, obj, request)
        async for _ in gen:
            pass
        if tags is not None:
            tags.append(obj.extra_key)

    return one


async def served_by_gate(gate: Any, key: str, body: bytes, chunks: int) -> None:
    """Raises RuntimeError unless ``gate`` passes the request through whole (so no refusal is what gets timed)."""
    seen: list[dict[str, Any]] = []
    await asgi_request(gate, key, body, seen)()
    status = seen[0].get("status") if seen else None
    events = sum(1 for m in seen if m.get("type") == "http.response.body" and m.get("body"))
    if status != 200 or events != chunks:
        raise RuntimeError(f"the gate answered {status} with {events} of {chunks} events: {seen[:2]}")


async def tagged(chunks: int) -> None:
    """Raises RuntimeError unless the hook tags the request with the tenant's namespace and counts it served."""
    tags: list[str] = []
    front = state.current()
    before = front.served.get(TENANT, {}).get("requests", 0) if front is not None else 0
    await generate_request(chunks, True, tags)()
    after = front.served.get(TENANT, {}).get("requests", 0) if front is not None else 0
    if not (tags and isinstance(tags[0], str) and tags[0].startswith(f"iso1.{TENANT}.")) or after != before + 1:
        raise RuntimeError(f"the hook did not tag and observe the request: tag {tags}, served {before} -> {after}")


async def per_request_us(one: Timed, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await one()
    return (time.perf_counter() - start) / n * 1e6


async def compare(name: str, bare: Timed, iso: Timed, requests: int, repeats: int) -> tuple[float, float]:
    """Best of ``repeats`` alternating timings of each; prints and returns (bare, iso) microseconds per request."""
    await per_request_us(bare, 200)
    await per_request_us(iso, 200)
    bare_us, iso_us = [], []
    for k in range(repeats):
        bare_us.append(await per_request_us(bare, requests))
        iso_us.append(await per_request_us(iso, requests))
        print(f"  {name}: repeat {k + 1}/{repeats}", flush=True)
    best_bare, best_iso = min(bare_us), min(iso_us)
    print(f"{name}: {best_bare:.1f} us bare, {best_iso:.1f} us with sglang-iso, {best_iso - best_bare:.1f} us its own "
          "per request", flush=True)  # fmt: skip
    return best_bare, best_iso


async def run(requests: int, repeats: int, chunks: int, seed: int) -> dict[str, tuple[float, float]]:
    key = new_api_key()
    made = write_tenants_file(Path(tempfile.mkdtemp()), {TENANT: ROOMY}, keys={TENANT: key})
    config = load_tenants_file(made.path)
    os.environ[envvars.TENANTS_FILE.name] = str(made.path)
    settings.reset()
    server_args = SimpleNamespace(model_path=None, tokenizer_path=None, kv_cache_dtype="auto", page_size=1, dp_size=1)
    state.set_current(FrontState(config, server_args))
    app = stand_in_app(chunks)
    gate = TenantGate(
        app, ReloadableKeys(KeyIndex(config)), limits=Limits(vocab_size=VOCAB, context_len=CONTEXT),
        admission=Admission(lambda _t: ROOMY["max_concurrent_requests"], default=64, queue_of=lambda _t: 0),
        rates=RateLimiter(lambda _t: RateLimits()),
    )  # fmt: skip
    results = {}
    for body in bodies(seed).values():
        await served_by_gate(gate, key, body, chunks)
    await tagged(chunks)
    for name, body in bodies(seed).items():
        results[f"gate, {name}"] = await compare(
            f"gate, {name}", asgi_request(app, key, body), asgi_request(gate, key, body), requests, repeats
        )
    results["tokenizer-manager hooks"] = await compare(
        "tokenizer-manager hooks", generate_request(chunks, False), generate_request(chunks, True), requests, repeats
    )
    return results


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000, help="requests per timing")
    p.add_argument("--repeats", type=int, default=5, help="alternating timings of each; the best is printed")
    p.add_argument("--chunks", type=int, default=17, help="streamed events per response (16 tokens and the end)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return asyncio.run(run(args.requests, args.repeats, args.chunks, args.seed))


if __name__ == "__main__":
    main()
