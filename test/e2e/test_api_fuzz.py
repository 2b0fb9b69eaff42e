"""Property-based fuzz of the live server's tenant API, generated from its own OpenAPI schema.

Bodies come from hypothesis-jsonschema over each tenant route's request schema (with a generic JSON strategy
for routes whose schema it cannot handle, and for raw, wrong-typed and hostile bodies), sent with a tenant key
on every method. Oracles: no response is a 5xx, the server stays up, and after the run both tenants are still
served with a same-tenant cache hit (positive control) and no cross-tenant hit, with no isolation violation.

``SGLANG_ISO_FUZZ_EXAMPLES`` sets the number of requests (CI default 120; ``benchmark/api_fuzz.py`` runs more).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sglang_iso.server.gate import TENANT_PATHS
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess

from .conftest import start_iso_server
from .helpers import assert_alive_and_isolated, call, write_alpha_beta

pytestmark = pytest.mark.e2e

EXAMPLES = int(os.environ.get("SGLANG_ISO_FUZZ_EXAMPLES", "120"))
METHODS = ("POST", "PUT", "GET", "PATCH", "DELETE")
# NOTE: generated bodies may ask for thousands of tokens; budgets are clamped so that a CI-sized run stays short.
BUDGET_FIELDS = ("max_new_tokens", "max_tokens", "max_completion_tokens", "min_new_tokens", "min_tokens", "n")
HOSTILE_FIELDS = (
    "rid", "request_id", "input_ids", "text", "prompt", "messages", "sampling_params", "top_logprobs_num",
    "logprob_start_len", "return_logprob", "stream", "lora_path", "cache_salt", "tokens", "top_logprobs", "logprobs",
)  # fmt: skip


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in ("alpha", "beta", "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    path = write_alpha_beta(tmp_path_factory.mktemp("tenants"), keys)
    srv = start_iso_server("--tenants-file", str(path), "--enable-cache-report")
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def _resolve(schema: Any, components: dict[str, Any], depth: int = 0) -> Any:
    """Inline ``#/components/schemas/X`` references (cut at depth 6: recursive schemas become ``{}``)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            return _resolve(components.get(name, {}), components, depth + 1) if depth < 6 else {}
        return {k: _resolve(v, components, depth) for k, v in schema.items() if k not in ("discriminator",)}
    if isinstance(schema, list):
        return [_resolve(v, components, depth) for v in schema]
    return schema


def route_strategies(openapi: dict[str, Any]) -> list[st.SearchStrategy[tuple[str, str, Any]]]:
    from hypothesis_jsonschema import from_schema

    components = openapi.get("components", {}).get("schemas", {})
    json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text()
    any_json = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4))
    hostile = st.dictionaries(st.sampled_from(HOSTILE_FIELDS), any_json, max_size=6)
    text = st.text(max_size=40)
    messages = st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": text}), min_size=1, max_size=3
    )
    budget = st.integers(0, 4)
    model = st.just("default")
    sampling = st.fixed_dictionaries({"max_new_tokens": budget})
    valid: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        "/generate": st.fixed_dictionaries({"text": text, "sampling_params": sampling}),
        "/v1/chat/completions": st.fixed_dictionaries({"model": model, "messages": messages, "max_tokens": budget}),
        "/v1/completions": st.fixed_dictionaries({"model": model, "prompt": text, "max_tokens": budget}),
        "/tokenize": st.fixed_dictionaries({"prompt": text}),
        "/v1/tokenize": st.fixed_dictionaries({"prompt": text}),
        "/detokenize": st.fixed_dictionaries({"tokens": st.lists(st.integers(0, 2047), max_size=8)}),
        "/v1/detokenize": st.fixed_dictionaries({"tokens": st.lists(st.integers(0, 2047), max_size=8)}),
    }  # fmt: skip
    strategies = []
    for path in sorted(TENANT_PATHS):
        body_strategy: st.SearchStrategy[Any] = hostile | any_json
        if path in valid:
            # Valid bodies with hostile fields mixed in reach the handlers, not only the gate.
            mutated = st.builds(
                lambda base, extra: {**base, **extra},
                valid[path],
                st.dictionaries(st.sampled_from(HOSTILE_FIELDS), any_json, max_size=2),
            )
            body_strategy = valid[path] | mutated | body_strategy
        for _method, op in (openapi.get("paths", {}).get(path) or {}).items():
            content = ((op or {}).get("requestBody") or {}).get("content", {}).get("application/json")
            if not content:
                continue
            try:
                schema = _resolve(content.get("schema", {}), components)
                generated = from_schema(schema)
                generated.example()  # NOTE: unsupported schemas fail here, not in the middle of the run
                body_strategy = generated | body_strategy
            except Exception:  # NOTE: a schema the generator cannot handle: the generic strategies still run
                pass
        methods = st.sampled_from(("POST", "POST", "POST", *METHODS))  # mostly the method the routes serve
        strategies.append(st.tuples(st.just(path), methods, body_strategy))
    return strategies


def _clamp(body: Any) -> Any:
    if isinstance(body, dict):
        for scope in (body, body.get("sampling_params")):
            if isinstance(scope, dict):
                for field in BUDGET_FIELDS:
                    if (
                        isinstance(scope.get(field), int)
                        and not isinstance(scope.get(field), bool)
                        and scope[field] > 4
                    ):
                        scope[field] = 4
    return body


def test_fuzz_tenant_routes_from_the_openapi_schema(server: ServerProcess, keys: dict[str, str]) -> None:
    status, openapi, _ = call(server, "GET", "/openapi.json", key=keys["admin"])
    assert status == 200 and "paths" in openapi
    strategy = st.one_of(route_strategies(openapi))
    seen: list[tuple[str, str, int]] = []
    failures: list[tuple[str, str, int, str]] = []
    started = time.monotonic()

    # NOTE: two bodies the handlers serve always run first, so a run whose random cases are all refused still
    # holds served requests next to the hostile ones (in one full-suite run every generated body was refused).
    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    @example(("/generate", "POST", {"text": "fuzz", "sampling_params": {"max_new_tokens": 2}}))
    @example(("/tokenize", "POST", {"prompt": "fuzz"}))
    def send(case: tuple[str, str, Any]) -> None:
        path, method, body = case
        raw = json.dumps(_clamp(body)).encode()
        code, out, _ = call(server, method, path, key=keys["beta"], raw=raw, timeout_s=120)
        seen.append((path, method, code))
        if code >= 500:
            failures.append((path, method, code, raw.decode()[:300] + " -> " + str(out)[:300]))
        if len(seen) % 25 == 0:
            rate = len(seen) / (time.monotonic() - started)
            print(f"fuzz: {len(seen)}/{EXAMPLES} requests, {rate:.1f}/s, ETA {(EXAMPLES - len(seen)) / rate:.0f}s")

    send()
    assert not failures, failures[:5]
    assert server.proc is not None and server.proc.poll() is None
    paths = {p for p, _, _ in seen}
    assert len(paths) >= len(TENANT_PATHS) // 2, sorted(paths)  # the run reached most routes
    assert any(code == 200 for _, _, code in seen)  # and some requests were served, not only refused
    assert_alive_and_isolated(server, keys)
    status, stats, _ = call(server, "GET", "/iso/tenants", key=keys["admin"])
    assert status == 200
    violations = sum(rank["violations"] for t in stats["tenants"].values() for rank in t["ranks"])
    assert violations == 0, stats
