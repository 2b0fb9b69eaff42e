"""Per-tenant rate limits on a real server: requests and tokens per minute, OpenAI's headers and SDK retry, reload.

Tenant ``rpm`` may send 6 requests a minute (one every 10 s after its burst), ``tpm`` 600 tokens a minute,
``free`` has no limits; all three in one server, one run. Waits are what the server's ``Retry-After`` says.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess
from sglang_iso_testing.tenants import TenantsFile, write_tenants_file

from .conftest import start_iso_server

pytestmark = pytest.mark.e2e

RPM = 6
TPM = 600
LIMITS: dict[str, dict[str, Any]] = {"rpm": {"requests_per_minute": RPM}, "tpm": {"tokens_per_minute": TPM}, "free": {}}
STOP_AT_ONCE = list(range(2048))
"""Every token id of the tiny model: generation stops after its first token (a served count far below the budget)."""


def write_tenants(directory: Path, keys: dict[str, str], secret: bytes | None = None, **free: Any) -> TenantsFile:
    """The three tenants with their limits (``free`` adds fields to tenant ``free``)."""
    tenants = {**LIMITS, "free": {**LIMITS["free"], **free}}
    return write_tenants_file(directory, tenants, keys=dict(keys), secret=secret)


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in (*LIMITS, "admin")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[tuple[ServerProcess, Path]]:
    path = write_tenants(tmp_path_factory.mktemp("rate-limits"), keys).path
    server = start_iso_server("--tenants-file", str(path))
    try:
        server.start()
        yield server, path
    finally:
        server.stop()


def generate(server: ServerProcess, key: str, max_new_tokens: int = 2, **params: Any) -> httpx.Response:
    body = {"text": "count to three", "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, **params}}
    return httpx.post(f"{server.base_url}/generate", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


def limits_of(server: ServerProcess, keys: dict[str, str], tenant: str) -> dict[str, Any]:
    status, out = server.get_with("/iso/tenants", {"Authorization": f"Bearer {keys['admin']}"})
    assert status == 200, out
    return dict(out["tenants"][tenant]["limits"])


def test_requests_per_minute_429_with_headers_reset_reload_and_sdk_retry(
    setup: tuple[ServerProcess, Path], keys: dict[str, str]
) -> None:
    server, path = setup
    remaining = []
    for _ in range(RPM):
        response = generate(server, keys["rpm"])
        assert response.status_code == 200, response.text
        assert response.headers["x-ratelimit-limit-requests"] == str(RPM)
        remaining.append(int(response.headers["x-ratelimit-remaining-requests"]))
    assert remaining == list(range(RPM - 1, -1, -1)), remaining  # the burst: one minute's worth
    refused = generate(server, keys["rpm"])
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    retry_after = int(refused.headers["retry-after"])
    assert 1 <= retry_after <= 60 // RPM, refused.headers
    assert refused.headers["x-ratelimit-remaining-requests"] == "0" and "x-ratelimit-reset-requests" in refused.headers
    free = generate(server, keys["free"])  # another tenant in the same run: unaffected, and sees no limit headers
    assert free.status_code == 200 and "x-ratelimit-limit-requests" not in free.headers

    # A reload that changes another tenant keeps rpm's spent minute spent.
    secret = (path.parent / "secret.key").read_bytes()
    write_tenants(path.parent, keys, secret, max_concurrent_requests=4)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while limits_of(server, keys, "free")["max_concurrent_requests"] != 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert limits_of(server, keys, "free")["max_concurrent_requests"] == 4  # the reload took effect
    assert generate(server, keys["rpm"]).status_code == 429
    assert limits_of(server, keys, "rpm")["rate_limited"] >= 2

    time.sleep(int(generate(server, keys["rpm"]).headers["retry-after"]))
    again = generate(server, keys["rpm"])
    assert again.status_code == 200, again.text  # served again after the reset

    # The OpenAI SDK reads Retry-After and succeeds on its retry.
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=keys["rpm"], max_retries=2, timeout=120)
    refused_before = limits_of(server, keys, "rpm")["rate_limited"]
    raw = client.completions.with_raw_response.create(model="default", prompt="count to three", max_tokens=2)
    assert raw.http_response.status_code == 200 and raw.parse().choices
    assert raw.headers["x-ratelimit-limit-requests"] == str(RPM)
    assert limits_of(server, keys, "rpm")["rate_limited"] > refused_before  # it was refused first, then retried


def test_tokens_per_minute_reserve_the_budget_and_settle_with_the_served_count(
    setup: tuple[ServerProcess, Path], keys: dict[str, str]
) -> None:
    server, _ = setup
    budget = 400
    first = generate(server, keys["tpm"], max_new_tokens=budget, stop_token_ids=STOP_AT_ONCE)
    assert first.status_code == 200, first.text
    meta = first.json()["meta_info"]
    served = meta["prompt_tokens"] + meta["completion_tokens"]
    reserved_left = int(first.headers["x-ratelimit-remaining-tokens"])
    assert reserved_left < TPM - budget + 50  # at the response's start the whole budget is held (+ a few s' refill)
    settled = limits_of(server, keys, "tpm")["remaining_tokens"]
    assert TPM - served <= settled < TPM - served + 50, (served, settled)  # settled with the served count
    # Two budgets that do not fit together: the second waits, another tenant does not.
    assert generate(server, keys["tpm"], max_new_tokens=budget, ignore_eos=True).status_code == 200
    refused = generate(server, keys["tpm"], max_new_tokens=budget)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded", refused.text
    assert int(refused.headers["retry-after"]) >= 1 and "x-ratelimit-reset-tokens" in refused.headers
    assert generate(server, keys["free"], max_new_tokens=budget).status_code == 200
    too_large = generate(server, keys["tpm"], max_new_tokens=TPM + 1)
    assert too_large.status_code == 400 and too_large.json()["error"]["param"] == "sampling_params.max_new_tokens", (
        too_large.text
    )
    time.sleep(int(refused.headers["retry-after"]))
    assert generate(server, keys["tpm"], max_new_tokens=budget).status_code == 200  # served after the wait
