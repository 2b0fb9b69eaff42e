"""Per-tenant rate limits: buckets, reservations, settling, headers; then through the gate."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_iso.server.admission import Admission
from sglang_iso.server.gate import TenantGate
from sglang_iso.server.rate_limits import (
    DEFAULT_OUTPUT_ESTIMATE,
    RateLimiter,
    RateLimits,
    format_duration,
    reservation,
    used_tokens,
)
from sglang_iso.tenancy.config import load_tenants_file
from sglang_iso.tenancy.keys import KeyIndex, new_api_key
from sglang_iso_testing.tenants import write_tenants_file


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(limits: dict[str, RateLimits]) -> tuple[RateLimiter, Clock]:
    clock = Clock()
    return RateLimiter(lambda t: limits.get(t, RateLimits()), clock), clock


def test_requests_per_minute_bursts_then_refills_at_the_limits_rate() -> None:
    rates, clock = limiter({"acme": RateLimits(requests_per_minute=3)})
    assert [rates.admit("acme", 0).admitted for _ in range(3)] == [True, True, True]
    refused = rates.admit("acme", 0)
    assert not refused.admitted and refused.limit == "requests"
    assert refused.retry_after_s == pytest.approx(20.0)  # one request every 60/3 s
    assert rates.refused == {"acme": 1}
    assert rates.admit("globex", 0).admitted  # another tenant, no limits: unaffected
    clock.now += 20.0
    assert rates.admit("acme", 0).admitted  # positive control: served again after the reset
    assert not rates.admit("acme", 0).admitted


def test_tokens_per_minute_reserve_then_settle_with_the_served_count() -> None:
    rates, clock = limiter({"acme": RateLimits(tokens_per_minute=600)})
    first = rates.admit("acme", 500)
    assert first.admitted and first.reserved_tokens == 500
    refused = rates.admit("acme", 200)
    assert not refused.admitted and refused.limit == "tokens"
    assert refused.retry_after_s == pytest.approx(10.0)  # 100 missing at 10 tokens/s
    rates.settle("acme", 500, 120)  # served far fewer than reserved: the rest comes back
    assert rates.admit("acme", 200).admitted
    # More than reserved: the bucket goes into debt and the tenant waits it out.
    rates.settle("acme", 200, 900)
    state = rates.state("acme")
    assert state["remaining_tokens"] < 0, state
    assert not rates.admit("acme", 1).admitted
    clock.now += 60.0
    assert rates.admit("acme", 1).admitted


def test_a_request_larger_than_the_whole_minute_is_refused_for_good() -> None:
    rates, _ = limiter({"acme": RateLimits(tokens_per_minute=100)})
    verdict = rates.admit("acme", 101)
    assert not verdict.admitted and math.isinf(verdict.retry_after_s)
    assert rates.admit("acme", 100).admitted  # positive control: the whole minute fits


def test_undo_gives_back_what_admit_took() -> None:
    rates, _ = limiter({"acme": RateLimits(requests_per_minute=1, tokens_per_minute=50)})
    verdict = rates.admit("acme", 50)
    assert verdict.admitted and not rates.admit("acme", 0).admitted
    rates.undo("acme", verdict)
    assert rates.admit("acme", 50).admitted


def test_counters_survive_a_reload_that_leaves_the_tenant_alone() -> None:
    limits = {"acme": RateLimits(requests_per_minute=2), "globex": RateLimits(requests_per_minute=2)}
    rates, _ = limiter(limits)
    for tenant in ("acme", "globex"):
        rates.admit(tenant, 0)
        rates.admit(tenant, 0)
    limits["globex"] = RateLimits(requests_per_minute=4)  # the reload changes globex only
    assert not rates.admit("acme", 0).admitted  # acme's spent minute is still spent
    assert rates.state("globex")["remaining_requests"] == 0  # the level is kept, the bucket is larger
    limits["acme"] = RateLimits()  # limit removed: no bucket, served
    assert rates.admit("acme", 0).admitted and rates.headers("acme") == []


def test_headers_are_openais() -> None:
    rates, clock = limiter({"acme": RateLimits(requests_per_minute=60, tokens_per_minute=6000)})
    rates.admit("acme", 3000)
    headers = {k.decode(): v.decode() for k, v in rates.headers("acme")}
    assert headers == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "6000",
        "x-ratelimit-remaining-tokens": "3000",
        "x-ratelimit-reset-tokens": "30s",
    }
    clock.now += 15.0
    assert dict(rates.headers("acme"))[b"x-ratelimit-remaining-tokens"] == b"4500"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0ms"), (0.25, "250ms"), (1.5, "1.5s"), (59.95, "60s"), (360.0, "6m0s"), (75.2, "1m16s")],
)
def test_reset_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_reservation_counts_prompts_and_budgets() -> None:
    words = len
    assert reservation({"text": "abc", "sampling_params": {"max_new_tokens": 7}}, words) == 3 + 7
    assert reservation({"input_ids": [1, 2, 3, 4]}, None) == 4 + DEFAULT_OUTPUT_ESTIMATE
    assert reservation({"prompt": ["ab", "cd"], "max_tokens": 5, "n": 2}, words) == 4 + 5 * 2 * 2
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}], "max_completion_tokens": 9}
    assert reservation(chat, words) == 5 + 9
    assert reservation({"text": "x" * 40, "sampling_params": {"max_new_tokens": 0}}, None) == 10  # bytes / 4

    def broken(_: str) -> int:
        raise RuntimeError("tokenizer failed")

    assert reservation({"text": "abcd", "max_tokens": 1}, broken) == 1 + 1  # falls back to the estimate


def test_used_tokens_reads_openai_usage_and_sglang_meta_info() -> None:
    assert used_tokens([{"usage": {"prompt_tokens": 10, "completion_tokens": 5}}]) == 15
    stream = [{"meta_info": {"id": "a", "prompt_tokens": 10, "completion_tokens": n}} for n in (1, 2, 3)]
    stream += [{"meta_info": {"id": "b", "prompt_tokens": 10, "completion_tokens": 4}}]
    assert used_tokens(stream) == 13 + 14
    assert used_tokens([[{"meta_info": {"id": "a", "prompt_tokens": 2, "completion_tokens": 2}}]]) == 4
    assert used_tokens([{"choices": []}, "junk", 3]) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "settle", "tick"]), st.integers(0, 700)), max_size=60))
def test_bucket_never_exceeds_its_size_and_refusals_take_nothing(ops: list[tuple[str, int]]) -> None:
    rates, clock = limiter({"acme": RateLimits(requests_per_minute=5, tokens_per_minute=600)})
    rates.headers("acme")  # makes the buckets
    reserved: list[int] = []
    for op, n in ops:
        before = rates.state("acme")
        if op == "admit":
            verdict = rates.admit("acme", n)
            if verdict.admitted:
                reserved.append(verdict.reserved_tokens)
            else:
                assert rates.state("acme") == before  # a refusal takes nothing
        elif op == "settle" and reserved:
            rates.settle("acme", reserved.pop(), n)
        else:
            clock.now += n / 10
        state = rates.state("acme")
        assert state.get("remaining_requests", 0) <= 5 and state.get("remaining_tokens", 0) <= 600, state


# --- through the gate ---------------------------------------------------------------------------------------------

KEYS = {"acme": new_api_key(), "globex": new_api_key()}


def tenants_file(tmp_path: Path, acme: dict[str, Any]) -> Path:
    """acme with the fields ``acme``, globex with none (the harness's builder: keys hashed, TOML checked)."""
    return write_tenants_file(tmp_path, {"acme": acme, "globex": {}}, keys=KEYS, admin=False).path


def usage_app(prompt: int, completion: int, *, wait: asyncio.Event | None = None) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        if wait is not None:
            await wait.wait()
        body = json.dumps({"usage": {"prompt_tokens": prompt, "completion_tokens": completion}}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    return app


def gate_for(tmp_path: Path, acme: dict[str, Any], app: Any, clock: Clock) -> tuple[TenantGate, RateLimiter, Admission]:
    config = load_tenants_file(tenants_file(tmp_path, acme))

    def rate_limits(tenant: str) -> RateLimits:
        t = config.tenants[tenant]
        return RateLimits(t.requests_per_minute, t.tokens_per_minute)

    rates = RateLimiter(rate_limits, clock)
    admission = Admission(
        lambda t: config.tenants[t].max_concurrent_requests, 8, lambda t: config.tenants[t].max_queued_requests
    )
    return TenantGate(app, KeyIndex(config), admission=admission, rates=rates, count_tokens=len), rates, admission


async def ask(gate: TenantGate, tenant: str, body: dict[str, Any], receive: Any = None) -> tuple[int, dict[str, str]]:
    raw = json.dumps(body).encode()
    scope = {"type": "http", "path": "/v1/completions", "method": "POST",
             "headers": [(b"authorization", f"Bearer {KEYS[tenant]}".encode())]}  # fmt: skip
    sent: list[dict[str, Any]] = []
    first = True

    async def default_receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await gate(scope, receive or default_receive, send)
    return sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0]["headers"]}


def test_gate_429s_a_tenant_over_its_tokens_with_headers_and_settles(tmp_path: Path) -> None:
    clock = Clock()
    g, rates, _ = gate_for(tmp_path, {"tokens_per_minute": 100}, usage_app(4, 6), clock)
    body = {"prompt": "abcd", "max_tokens": 60}  # reserves 64, serves 10

    async def run() -> None:
        status, headers = await ask(g, "acme", body)
        assert status == 200 and headers["x-ratelimit-limit-tokens"] == "100", headers
        assert headers["x-ratelimit-remaining-tokens"] == "36"  # at the response's start: the reservation holds
        assert rates.state("acme")["remaining_tokens"] == 90  # settled with the served 10
        assert (await ask(g, "acme", body))[0] == 200
        status, headers = await ask(g, "acme", {"prompt": "abcd", "max_tokens": 90})
        assert status == 429 and int(headers["retry-after"]) >= 1 and "x-ratelimit-reset-tokens" in headers
        globex_status, globex_headers = await ask(g, "globex", {"prompt": "abcd", "max_tokens": 90})
        assert globex_status == 200 and "x-ratelimit-limit-tokens" not in globex_headers  # not limited
        assert (await ask(g, "acme", {"prompt": "abcd", "max_tokens": 200}))[0] == 400  # never fits a minute
        clock.now += 60
        assert (await ask(g, "acme", {"prompt": "abcd", "max_tokens": 90}))[0] == 200  # served after the reset

    asyncio.run(run())


def test_gate_queues_up_to_the_limit_then_429s_and_a_leaver_leaves_the_queue(tmp_path: Path) -> None:
    release = asyncio.Event()
    clock = Clock()
    g, _, admission = gate_for(
        tmp_path, {"max_concurrent_requests": 1, "max_queued_requests": 1}, usage_app(1, 1, wait=release), clock
    )

    async def run() -> None:
        first = asyncio.create_task(ask(g, "acme", {"prompt": "a"}))
        await asyncio.sleep(0.01)
        queued = asyncio.create_task(ask(g, "acme", {"prompt": "b"}))
        await asyncio.sleep(0.01)
        assert admission.queued("acme") == 1
        assert (await ask(g, "acme", {"prompt": "c"}))[0] == 429  # the queue is full
        other = asyncio.create_task(ask(g, "globex", {"prompt": "d"}))  # another tenant is not queued behind acme
        await asyncio.sleep(0.01)
        release.set()
        assert (await first)[0] == 200 and (await queued)[0] == 200 and (await other)[0] == 200
        assert admission.in_flight == {} and admission.waiting == {}
        # A queued client that leaves gives its place up (and no slot leaks).
        release.clear()
        held = asyncio.create_task(ask(g, "acme", {"prompt": "a"}))
        await asyncio.sleep(0.01)
        left = asyncio.Event()
        messages = iter([{"type": "http.request", "body": b'{"prompt": "e"}', "more_body": False}])

        async def leaving_receive() -> dict[str, Any]:
            message = next(messages, None)
            if message is not None:
                return message
            await left.wait()
            return {"type": "http.disconnect"}

        leaver = asyncio.create_task(ask(g, "acme", {}, receive=leaving_receive))
        await asyncio.sleep(0.01)
        assert admission.queued("acme") == 1
        left.set()
        assert (await leaver)[0] == 429
        assert admission.queued("acme") == 0
        release.set()
        assert (await held)[0] == 200 and admission.in_flight == {}

    asyncio.run(run())


@pytest.mark.parametrize("field", ["requests_per_minute", "tokens_per_minute", "max_queued_requests"])
@pytest.mark.parametrize("value", [0, -5, 1.5, True, "10"])
def test_a_bad_limit_is_a_startup_error_naming_the_field(tmp_path: Path, field: str, value: object) -> None:
    from sglang_iso.tenancy.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"tenants\[0\]\.{field}"):
        load_tenants_file(tenants_file(tmp_path, {field: value}))
    config = load_tenants_file(tenants_file(tmp_path, {field: 7}))  # positive control: a valid value loads
    assert getattr(config.tenants["acme"], field) == 7
