"""sglang-router (``--policy manual``) in front of two sglang-iso workers sharing one tenants file.

Clients send ``x-smg-routing-key: <tenant id>``, as a gateway would. The routing key buys cache
affinity only: every worker authenticates the key and namespaces by tenant, so a request steered onto
another tenant's worker reuses nothing of it. Every isolation check has a positive control in the same
run. The last test kills a worker; it runs last because it leaves the module's router with one worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess, free_port
from sglang_iso_testing.routing import ROUTING_KEY_HEADER, router_argv, wait_for_workers

from .conftest import start_iso_server
from .helpers import TWO_TENANTS, auth, long_prompt, write_two_tenants_file

pytestmark = pytest.mark.e2e

CLIENT_TIMEOUT_S = 60.0
# NOTE: few retries with short backoff, so a request that lands on a dead worker is answered within
# seconds (the defaults, 5 retries backing off up to 30 s, took about 50 s here).
ROUTER_FLAGS = (
    "--retry-max-retries",
    "2",
    "--retry-max-backoff-ms",
    "500",
    "--request-timeout-secs",
    "60",
    "--log-level",
    "warn",
)


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in (*TWO_TENANTS, "admin")}


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[list[ServerProcess]]:
    path = write_two_tenants_file(tmp_path_factory.mktemp("tenants"), keys)
    servers = [start_iso_server("--tenants-file", str(path), "--enable-cache-report") for _ in range(2)]
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.start(timeout_s=300), servers))
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def router(workers: list[ServerProcess]) -> Iterator[ServerProcess]:
    port = free_port()
    proc = ServerProcess(router_argv(port, [w.base_url for w in workers], *ROUTER_FLAGS), port)
    try:
        proc.start(timeout_s=120)
        wait_for_workers(proc.base_url, len(workers), timeout_s=120)
        yield proc
    finally:
        proc.stop()


def route(router: ServerProcess, key: str, routing_key: str, text: str, **sampling: Any) -> tuple[int, Any]:
    """POST /generate through the router; a client timeout bounds every call (it raises, never hangs)."""
    return router.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0, **sampling}},
        headers={**auth(key), ROUTING_KEY_HEADER: routing_key},
        timeout_s=CLIENT_TIMEOUT_S,
    )


def routed_meta(router: ServerProcess, key: str, routing_key: str, text: str) -> dict[str, Any]:
    status, out = route(router, key, routing_key, text)
    assert status == 200, out
    return dict(out["meta_info"])


def tenant_stats(worker: ServerProcess, admin_key: str, tenant: str) -> dict[str, int]:
    status, out = worker.get_with("/iso/tenants", auth(admin_key))
    assert status == 200, out
    return dict(out["tenants"][tenant]["ranks"][0])  # all counters 0 until the tenant's first request there


def lookups(workers: list[ServerProcess], admin_key: str, tenant: str) -> list[int]:
    """Per worker, the prompt tokens it has looked up in ``tenant``'s cache so far."""
    return [tenant_stats(w, admin_key, tenant)["lookup_tokens"] for w in workers]


def serving_workers(workers: list[ServerProcess], admin_key: str, tenant: str, before: list[int]) -> list[int]:
    """Indexes of the workers whose lookups for ``tenant`` grew since ``before`` (from :func:`lookups`)."""
    now = lookups(workers, admin_key, tenant)
    return [i for i, (b, n) in enumerate(zip(before, now, strict=True)) if n > b]


def test_router_rejects_unknown_keys_like_a_worker(router: ServerProcess) -> None:
    status, out = route(router, "sk-iso-not-a-real-key", "acme", "hi")
    assert status == 401 and out["error"]["code"] == "invalid_api_key"


def test_same_tenant_sticks_to_one_worker_and_hits_its_cache(
    router: ServerProcess, workers: list[ServerProcess], keys: dict[str, str]
) -> None:
    prompt = long_prompt()
    before = lookups(workers, keys["admin"], "acme")
    metas = [routed_meta(router, keys["acme"], "acme", prompt) for _ in range(3)]
    assert metas[0]["cached_tokens"] == 0
    for meta in metas[1:]:
        assert meta["cached_tokens"] >= meta["prompt_tokens"] - 1 > 0, metas  # affinity: every repeat hits
    assert len(serving_workers(workers, keys["admin"], "acme", before)) == 1


def test_routing_key_steers_but_never_shares(
    router: ServerProcess, workers: list[ServerProcess], keys: dict[str, str]
) -> None:
    prompt = long_prompt()
    acme_before, globex_before = lookups(workers, keys["admin"], "acme"), lookups(workers, keys["admin"], "globex")
    routed_meta(router, keys["acme"], "acme", prompt)
    assert routed_meta(router, keys["acme"], "acme", prompt)["cached_tokens"] > 0  # positive control
    # globex picks acme's routing key: it lands on the worker holding acme's entry, and reuses nothing.
    steered = routed_meta(router, keys["globex"], "acme", prompt)
    assert steered["cached_tokens"] == 0
    acme_worker = serving_workers(workers, keys["admin"], "acme", acme_before)
    assert len(acme_worker) == 1 and serving_workers(workers, keys["admin"], "globex", globex_before) == acme_worker
    again = routed_meta(router, keys["globex"], "acme", prompt)
    assert again["cached_tokens"] >= again["prompt_tokens"] - 1  # globex's own entry on that worker
    for worker in workers:
        for tenant in TWO_TENANTS:
            assert tenant_stats(worker, keys["admin"], tenant)["violations"] == 0


def test_killed_worker_fails_over_or_fails_cleanly_and_isolation_holds(
    router: ServerProcess, workers: list[ServerProcess], keys: dict[str, str]
) -> None:
    prompt = long_prompt()
    before = lookups(workers, keys["admin"], "acme")
    routed_meta(router, keys["acme"], "acme", prompt)
    (victim_index,) = serving_workers(workers, keys["admin"], "acme", before)
    victim, survivor = workers[victim_index], workers[1 - victim_index]

    with ThreadPoolExecutor(1) as pool:
        # A request in flight on the victim when it dies: answered (retried elsewhere) or an HTTP error.
        in_flight = pool.submit(
            route, router, keys["acme"], "acme", long_prompt(), max_new_tokens=1000, ignore_eos=True
        )
        time.sleep(1.0)
        victim.stop()
        in_flight_status, out = in_flight.result(timeout=CLIENT_TIMEOUT_S + 10)
    assert in_flight_status == 200 or 500 <= in_flight_status < 600, (in_flight_status, out)

    outcomes: list[tuple[int, float]] = []
    recovered = False
    deadline = time.monotonic() + 150
    for _ in range(12):
        if time.monotonic() > deadline:
            break
        t0 = time.monotonic()
        status, out = route(router, keys["acme"], "acme", prompt)
        outcomes.append((status, round(time.monotonic() - t0, 1)))
        assert status == 200 or 500 <= status < 600, (status, out)
        if status == 200:
            recovered = True
            break
        time.sleep(1.0)
    assert recovered, f"the router never failed over to the surviving worker: {outcomes}"
    print(f"in-flight request when the worker died: {in_flight_status}; afterwards (status, s): {outcomes}")

    # Afterwards: acme's entry on the survivor is acme's only.
    assert routed_meta(router, keys["acme"], "acme", prompt)["cached_tokens"] > 0  # positive control
    # globex's first request for this prompt; with one worker left, any routing key lands there.
    assert routed_meta(router, keys["globex"], "acme", prompt)["cached_tokens"] == 0
    for tenant in TWO_TENANTS:
        assert tenant_stats(survivor, keys["admin"], tenant)["violations"] == 0
