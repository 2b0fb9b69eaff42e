"""Prefill/decode disaggregation: router + prefill + decode, KV moved by Mooncake over TCP on loopback.

One module-scoped set of servers: a prefill and a decode worker (``--disaggregation-transfer-backend
mooncake_tcp``, ``SGLANG_HOST_IP=127.0.0.1`` so the transfer engine talks loopback only) and
``sglang-iso router --pd-disaggregation`` (sglang-router behind the front gate, with its own router key).
Faults are injected in the real schedulers (the test plugin ``sglang_iso_testing.pd_faults``):
a prefill that tags KV for another namespace, and a transfer that stalls, is aborted and then written
(poisoned) after the abort. Every isolation check has its positive control in the same run.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import openai
import pytest

from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing import pd_faults
from sglang_iso_testing.process import ServerProcess, free_port
from sglang_iso_testing.tenants import write_tenants_file

from .conftest import start_iso_server
from .helpers import (
    CLIENT_TIMEOUT_S,
    auth,
    long_prompt,
    pd_state,
    router_generate,
    router_ok,
    until,
    wait_for_router_workers,
)

pytestmark = pytest.mark.e2e

DRAIN_TIMEOUT_S = 3
PD_ENV = {
    "SGLANG_HOST_IP": "127.0.0.1",  # NOTE: the transfer engine and bootstrap server advertise loopback only
    **pd_faults.plugin_env(),
    "SGLANG_ISO_PD_DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S),
}


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in ("acme", "globex", "admin", "router")}


@pytest.fixture(scope="module")
def tenants_file(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Path:
    return write_tenants_file(tmp_path_factory.mktemp("pd"), ["acme", "globex"], keys=keys, router=True).path


@pytest.fixture(scope="module")
def pd(tenants_file: Path, keys: dict[str, str]) -> Iterator[dict[str, ServerProcess]]:
    common = ("--tenants-file", str(tenants_file), "--enable-cache-report",
              "--disaggregation-transfer-backend", "mooncake_tcp")  # fmt: skip
    bootstrap = free_port()
    servers = {
        "prefill": start_iso_server(*common, "--disaggregation-mode", "prefill",
                                    "--disaggregation-bootstrap-port", str(bootstrap), env=PD_ENV),
        "decode": start_iso_server(*common, "--disaggregation-mode", "decode", "--kv-owner-check", "off", env=PD_ENV),
    }  # fmt: skip
    port = free_port()
    argv = [
        sys.executable, "-m", "sglang_iso.cli", "router", "--pd-disaggregation", "--tenants-file", str(tenants_file),
        "--host", "127.0.0.1", "--port", str(port),
        "--prefill", servers["prefill"].base_url, str(bootstrap), "--decode", servers["decode"].base_url,
        "--policy", "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--request-timeout-secs", "60", "--log-level", "warn",
        # NOTE: a refused transfer must reach the client, not be retried on a fresh room (or open the breaker).
        "--disable-retries", "--disable-circuit-breaker",
    ]  # fmt: skip
    servers["router"] = ServerProcess(argv, port, env={**PD_ENV, "SGLANG_ISO_ROUTER_KEY": keys["router"]})
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(timeout_s=400), (servers["prefill"], servers["decode"])))
        servers["router"].start(timeout_s=120)
        wait_for_router_workers(servers["router"], keys["admin"], 2)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def command(server: ServerProcess, admin_key: str, name: str) -> bool:
    status, out = server.post("/set_internal_state", {"server_args": {name: 1}}, headers=auth(admin_key))
    assert status == 200, out
    replies = out if isinstance(out, list) else [out]  # one reply per scheduler: a bool or {"updated": bool}
    return bool(replies) and all(r.get("updated") if isinstance(r, dict) else r is True for r in replies)


def test_workers_refuse_tenants_without_the_router(pd: dict[str, ServerProcess], keys: dict[str, str]) -> None:
    for role in ("prefill", "decode"):
        status, out = pd[role].post("/generate", {"text": "hi"}, headers=auth(keys["acme"]))
        assert status == 400 and out["error"]["param"] == "bootstrap_host", out
        boot = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 7}
        status, out = pd[role].post("/generate", {"text": "hi", **boot}, headers=auth(keys["acme"]))
        assert status == 400 and out["error"]["code"] == "forbidden_field", out
        assert pd[role].get("/health")[0] == 200  # still serving
        # SGLang's own health probe runs a fake transfer through the guarded paths (no tag: no KV moves).
        assert pd[role].get("/health_generate", timeout_s=60)[0] == 200


def test_same_tenant_reuses_prefill_cache_other_tenant_misses(
    pd: dict[str, ServerProcess], keys: dict[str, str]
) -> None:
    prompt = long_prompt()
    first = router_ok(pd["router"], keys["acme"], prompt)
    again = router_ok(pd["router"], keys["acme"], prompt)
    assert again["meta_info"]["cached_tokens"] > 0, again["meta_info"]  # positive control: prefill-side reuse
    other = router_ok(pd["router"], keys["globex"], prompt)
    assert other["meta_info"]["cached_tokens"] == 0, other["meta_info"]
    assert first["output_ids"] == again["output_ids"] == other["output_ids"]  # the KV decode received is right
    prefill = pd_state(pd["prefill"], keys["admin"])
    assert prefill["succeeded_transfers_total"] >= 3 and prefill["transfers_in_flight"] == 0, prefill
    decode = pd_state(pd["decode"], keys["admin"])
    assert decode["tags_checked"] >= 3 and decode["tag_violations"] == 0, decode


def test_forged_namespace_is_refused_before_commit(pd: dict[str, ServerProcess], keys: dict[str, str]) -> None:
    prompt = long_prompt()
    reference = router_ok(pd["router"], keys["acme"], prompt)["output_ids"]
    before = pd_state(pd["decode"], keys["admin"])["tag_violations"]
    assert command(pd["prefill"], keys["admin"], pd_faults.COMMAND + "forge")
    status, out = router_generate(pd["router"], keys["acme"], prompt)
    assert status != 200, out
    assert pd_state(pd["decode"], keys["admin"])["tag_violations"] == before + 1
    assert router_ok(pd["router"], keys["acme"], prompt)["output_ids"] == reference  # positive control: serves again


def test_aborted_transfer_never_hands_a_page_to_another_request(
    pd: dict[str, ServerProcess], keys: dict[str, str]
) -> None:
    admin = keys["admin"]
    prompts = [long_prompt() for _ in range(3)]
    references = [router_ok(pd["router"], keys["globex"], p)["output_ids"] for p in prompts]
    assert command(pd["decode"], admin, pd_faults.COMMAND + "stall")
    result: dict[str, Any] = {}
    stalled = threading.Thread(
        target=lambda: result.update(out=router_generate(pd["router"], keys["acme"], long_prompt(), rid="stalled"))
    )
    stalled.start()
    until(lambda: pd_state(pd["decode"], admin)["transfers_in_flight"] > 0, "the stalled transfer")
    status, out = pd["decode"].post("/abort_request", {"rid": "acme.stalled"}, headers=auth(admin))
    assert status == 200, out
    stalled.join(CLIENT_TIMEOUT_S)
    assert result["out"][0] != 200, result
    # The late write landed after the abort; no drain is ever reported: the pages time out, quarantined.
    until(lambda: pd_state(pd["decode"], admin)["transfers_timed_out"] == 1, "the drain timeout")
    state = pd_state(pd["decode"], admin)
    assert state["quarantined_pages"] > 0 and state["timed_out_pages"] == state["quarantined_pages"], state
    assert command(pd["decode"], admin, pd_faults.COMMAND + "check_poison")
    # Other requests, a pool flush in between, never get those pages: outputs as before, poison untouched.
    for prompt, reference in zip(prompts, references, strict=True):
        assert router_ok(pd["router"], keys["globex"], prompt)["output_ids"] == reference
    # NOTE: SGLang flushes only an idle scheduler (400 otherwise); the decode worker may still be retiring the
    # last request's transfer state for a moment after its response.
    until(lambda: pd["decode"].post("/flush_cache", {}, headers=auth(admin))[0] == 200, "an idle decode flush")
    for prompt, reference in zip(prompts, references, strict=True):
        assert router_ok(pd["router"], keys["globex"], prompt)["output_ids"] == reference
    assert command(pd["decode"], admin, pd_faults.COMMAND + "check_poison")
    # The operator reclaims them: released through the scrubber; requests still read their own KV.
    status, out = pd["decode"].post("/iso/pd/reclaim", {}, headers=auth(admin))
    assert status == 200 and out["pd"][0]["quarantined_pages"] == 0, out
    assert out["pd"][0]["reclaimed_pages_total"] == state["quarantined_pages"]
    for prompt, reference in zip(prompts, references, strict=True):
        assert router_ok(pd["router"], keys["globex"], prompt)["output_ids"] == reference


def test_prefill_abort_keeps_pages_quarantined_through_a_tenant_flush(
    pd: dict[str, ServerProcess], keys: dict[str, str]
) -> None:
    """The incident's prefill half: an aborted request's pages may still be read by the engine."""
    admin, prefill = keys["admin"], pd["prefill"]
    prompts = [long_prompt() for _ in range(2)]
    references = [router_ok(pd["router"], keys["globex"], p)["output_ids"] for p in prompts]
    assert command(prefill, admin, pd_faults.COMMAND + "stall")
    stalled = threading.Thread(
        target=router_generate, args=(pd["router"], keys["acme"], long_prompt()), kwargs={"rid": "ps"}
    )
    stalled.start()
    until(lambda: pd_state(prefill, admin)["transfers_in_flight"] > 0, "the stalled prefill transfer")
    assert prefill.post("/abort_request", {"rid": "acme.ps"}, headers=auth(admin))[0] == 200
    stalled.join(CLIENT_TIMEOUT_S)
    until(lambda: pd_state(prefill, admin)["transfers_timed_out"] == 1, "the prefill drain timeout")
    # The aborted request's KV went to acme's cache; flushing acme frees it, but the quarantine holds it back.
    status, out = prefill.post("/iso/flush", {"tenant": "acme"}, headers=auth(admin))
    assert status == 200 and out["flushed"], out
    state = pd_state(prefill, admin)
    assert state["quarantined_pages"] > 0, state
    for prompt, reference in zip(prompts, references, strict=True):
        assert router_ok(pd["router"], keys["globex"], prompt)["output_ids"] == reference
    assert command(prefill, admin, pd_faults.COMMAND + "check_poison")  # none of them was handed out
    status, out = prefill.post("/iso/pd/reclaim", {}, headers=auth(admin))
    assert status == 200 and out["pd"][0]["quarantined_pages"] == 0, out


class _Answer(NamedTuple):
    texts: list[str]
    cached: int
    id: str


def _ask(router: ServerProcess, key: str, route: str, prompt: str, *, stream: bool = False, **extra: Any) -> _Answer:
    """One OpenAI SDK call through the PD router: the choices' texts in index order, cached prompt tokens, the id."""
    client = openai.OpenAI(base_url=router.base_url + "/v1", api_key=key, timeout=CLIENT_TIMEOUT_S, max_retries=0)
    common: dict[str, Any] = {"model": "default", "max_tokens": 6, "temperature": 0, **extra}
    if stream:
        common["stream_options"] = {"include_usage": True}
    if route == "chat":
        out: Any = client.chat.completions.create(
            messages=[{"role": "user", "content": prompt}], stream=stream, **common
        )
    else:
        out = client.completions.create(prompt=prompt, stream=stream, **common)
    texts: dict[int, str] = {}
    usage: Any = None
    ids = set()
    for chunk in out if stream else [out]:
        ids.add(chunk.id)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            piece = (choice.delta.content if stream else choice.message.content) if route == "chat" else choice.text
            texts[choice.index] = texts.get(choice.index, "") + (piece or "")
    assert len(ids) == 1, ids  # one response, even when its samples were separate requests
    details = usage.prompt_tokens_details if usage is not None else None
    return _Answer([texts[i] for i in sorted(texts)], int(details.cached_tokens or 0) if details else -1, ids.pop())


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_openai_routes_through_the_router_keep_the_tenant_guarantees(
    pd: dict[str, ServerProcess], keys: dict[str, str], route: str
) -> None:
    """Chat and completions, streamed or not, n > 1, with and without a client id, for both tenants."""
    router, prompt = pd["router"], long_prompt()
    before = {role: pd_state(pd[role], keys["admin"]) for role in ("prefill", "decode")}
    first = _ask(router, keys["acme"], route, prompt)
    assert first.cached == 0 and len(first.texts) == 1
    again = _ask(router, keys["acme"], route, prompt, stream=True)
    assert again.cached > 0, again  # positive control: acme's own prefill is reused, streamed
    other = _ask(router, keys["globex"], route, prompt)
    assert other.cached == 0, other  # isolation: the same text from another tenant misses
    assert first.texts == again.texts == other.texts  # the KV each decode received is right
    for tenant, stream in (("acme", False), ("globex", True)):
        samples = _ask(router, keys[tenant], route, prompt, stream=stream, n=3)
        assert samples.texts == first.texts * 3 and samples.cached > 0, samples  # greedy: every sample equal
    field = "rid" if route == "chat" else "request_id"
    mine = _ask(router, keys["globex"], route, prompt, extra_body={field: "mine-1"})
    assert mine.texts == first.texts and mine.id.endswith("globex.mine-1"), mine  # the client's id, in its space
    for role in ("prefill", "decode"):  # other tests in this module plant violations on purpose: compare deltas
        state = pd_state(pd[role], keys["admin"])
        assert state["tag_violations"] == before[role]["tag_violations"], state
        assert state["transfers_in_flight"] == 0, state
    assert pd_state(pd["decode"], keys["admin"])["tags_checked"] > before["decode"]["tags_checked"]
