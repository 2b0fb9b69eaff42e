"""SIGKILL of a prefill worker while the decode has transfers open to it, behind the PD router with two prefills.

Servers (module scope): prefill ``a``, prefill ``b``, one decode (Mooncake over TCP on loopback) and
``sglang-iso router --pd-disaggregation`` over all three, with sglang-router's retries and health checks on.
Prefill ``a``'s scheduler is stopped (SIGSTOP), so the requests the router sends there stay open while the decode
has published its pages to ``a``; then every process of ``a`` is SIGKILLed, as a crashed node would be.

The decode, the surviving side, learns of the death from SGLang's own heartbeat. A dead peer can never acknowledge
a drain, so the pages it might still have written stay quarantined past the drain timeout, through other tenants'
traffic and a flush, until the operator reclaims them. The router fails over to ``b``: both tenants are served
with the outputs they had before the crash, and each tenant's repeat hits its own cache (the positive control)
while the other tenant's same text misses.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from sglang_iso.tenancy.keys import new_api_key
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
    router_workers,
    until,
    wait_for_router_workers,
)

pytestmark = pytest.mark.e2e

DRAIN_TIMEOUT_S = 3
PD_ENV = {
    "SGLANG_HOST_IP": "127.0.0.1",  # NOTE: the transfer engine and bootstrap server advertise loopback only
    "SGLANG_ISO_PD_DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S),
    # SGLang's decode-side heartbeat to each prefill: the fastest it allows (2 s), one miss is a failure.
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "1",
    # SGLang itself holds a failed transfer's decode pages until the prefill acks the abort, then frees them
    # anyway after this many seconds (default 30): from then on only the quarantine holds them back.
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "5",
}


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in ("acme", "globex", "admin", "router")}


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[dict[str, ServerProcess]]:
    directory = tmp_path_factory.mktemp("pdkill")
    tenants: Path = write_tenants_file(directory, ["acme", "globex"], keys=keys, router=True).path
    common = ("--tenants-file", str(tenants), "--disaggregation-transfer-backend", "mooncake_tcp")
    boot = {"a": free_port(), "b": free_port()}
    servers = {
        name: start_iso_server(*common, "--disaggregation-mode", "prefill",
                               "--disaggregation-bootstrap-port", str(boot[name]), env=PD_ENV)
        for name in ("a", "b")
    }  # fmt: skip
    servers["decode"] = start_iso_server(*common, "--disaggregation-mode", "decode", "--kv-owner-check", "off",
                                         env=PD_ENV)  # fmt: skip
    port = free_port()
    argv = [
        sys.executable, "-m", "sglang_iso.cli", "router", "--pd-disaggregation", "--tenants-file", str(tenants),
        "--host", "127.0.0.1", "--port", str(port),
        "--prefill", servers["a"].base_url, str(boot["a"]), "--prefill", servers["b"].base_url, str(boot["b"]),
        "--decode", servers["decode"].base_url,
        "--policy", "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--request-timeout-secs", "60", "--log-level", "warn",
        "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
    ]  # fmt: skip
    servers["router"] = ServerProcess(argv, port, env={**PD_ENV, "SGLANG_ISO_ROUTER_KEY": keys["router"]})
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda s: s.start(timeout_s=500), (servers["a"], servers["b"], servers["decode"])))
        servers["router"].start(timeout_s=120)
        wait_for_router_workers(servers["router"], keys["admin"], 3)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def _schedulers(server: ServerProcess) -> list[psutil.Process]:
    """The server's scheduler processes (SGLang titles them ``sglang::scheduler...``)."""
    assert server.proc is not None
    children = psutil.Process(server.proc.pid).children(recursive=True)
    found = [p for p in children if "sglang::scheduler" in " ".join(p.cmdline())]
    assert found, [" ".join(p.cmdline())[:80] for p in children]
    return found


def test_a_prefill_killed_with_open_transfers_leaves_the_decode_pages_quarantined(
    pd: dict[str, ServerProcess], keys: dict[str, str]
) -> None:
    router, decode, admin = pd["router"], pd["decode"], keys["admin"]
    prompts = [long_prompt() for _ in range(4)]
    references = [router_ok(router, keys["globex"], p)["output_ids"] for p in prompts]  # through a and b
    before = pd_state(decode, admin)
    assert before["quarantined_pages"] == 0 and before["transfers_in_flight"] == 0, before

    for proc in _schedulers(pd["a"]):
        proc.send_signal(signal.SIGSTOP)
    answers: dict[int, tuple[int, Any]] = {}
    clients = [
        threading.Thread(target=lambda i=i, p=p: answers.update({i: router_generate(router, keys["acme"], p)}))
        for i, p in enumerate(prompts)
    ]
    for client in clients:
        client.start()
    # Round robin sends some of them to a: the decode publishes its pages to a, and a never sends.
    until(lambda: pd_state(decode, admin)["transfers_in_flight"] > 0, "transfers open to the stopped prefill")
    open_transfers = pd_state(decode, admin)["transfers_in_flight"]
    assert pd["a"].proc is not None
    os.killpg(pd["a"].proc.pid, signal.SIGKILL)  # every process of a, the stopped scheduler included

    until(
        lambda: pd_state(decode, admin)["transfers_timed_out"] > before["transfers_timed_out"],
        "the decode to give up on the dead prefill and time the drain out",
        timeout_s=120,
    )
    for client in clients:
        client.join(CLIENT_TIMEOUT_S)
    assert not any(c.is_alive() for c in clients), "a client still waits on the dead prefill"
    for i, (status, out) in answers.items():  # a refusal, or the router's retry on b: never another answer
        assert status != 200 or out["output_ids"] == references[i], (status, out)
    # No drain ack can come from the dead peer: SGLang's own deferred release gives up and frees the pages, and
    # the quarantine holds every page of the timed-out transfers back.
    until(
        lambda: 0 < pd_state(decode, admin)["timed_out_pages"] <= pd_state(decode, admin)["quarantined_pages"],
        "SGLang to free the failed transfers' pages into the quarantine",
    )
    held = pd_state(decode, admin)
    assert held["transfers_timed_out"] >= 1 and held["timed_out_pages"] == held["quarantined_pages"], (
        open_transfers,
        held,
    )

    # The router fails over: a is marked down, b serves both tenants with the outputs of before the crash.
    def a_is_down() -> bool:
        workers = router_workers(router, admin)
        return not any(w.get("is_healthy") and pd["a"].base_url in str(w.get("url")) for w in workers)

    until(a_is_down, "the router to mark the dead prefill down")
    for prompt, reference in zip(prompts, references, strict=True):
        assert router_ok(router, keys["globex"], prompt)["output_ids"] == reference
    fresh = long_prompt()
    first = router_ok(router, keys["acme"], fresh)
    again = router_ok(router, keys["acme"], fresh)
    assert again["meta_info"]["cached_tokens"] > 0, again["meta_info"]  # positive control: acme's own hit on b
    other = router_ok(router, keys["globex"], fresh)
    assert other["meta_info"]["cached_tokens"] == 0, other["meta_info"]  # isolation holds after the failover
    assert first["output_ids"] == again["output_ids"] == other["output_ids"]

    # Traffic and a flush did not release the pages the dead peer might have written.
    until(lambda: decode.post("/flush_cache", {}, headers=auth(admin))[0] == 200, "an idle decode flush")
    after = pd_state(decode, admin)
    assert after["quarantined_pages"] == held["quarantined_pages"], (held, after)
    assert after["tag_violations"] == before["tag_violations"], after
    # An erase of acme on the decode cannot zero pages the dead peer might still write: its receipt counts them
    # and is not complete; globex's transfers fence nothing (control).
    status, receipt = decode.post("/iso/tenants/acme/erase", {}, headers=auth(admin))
    assert status == 200 and receipt["erased"] and not receipt["complete"], receipt
    assert receipt["totals"]["pd_pages_fenced"] >= held["timed_out_pages"] > 0, receipt
    status, receipt = decode.post("/iso/tenants/globex/erase", {}, headers=auth(admin))
    assert status == 200 and receipt["complete"] and receipt["totals"]["pd_pages_fenced"] == 0, receipt
    # The operator reclaims them: released through the scrubber; both tenants are still served right.
    status, out = decode.post("/iso/pd/reclaim", {}, headers=auth(admin))
    assert status == 200 and out["pd"][0]["quarantined_pages"] == 0, out
    assert out["pd"][0]["reclaimed_pages_total"] >= held["quarantined_pages"], out
    status, receipt = decode.post("/iso/tenants/acme/erase", {}, headers=auth(admin))
    assert status == 200 and receipt["complete"] and receipt["totals"]["pd_pages_fenced"] == 0, receipt
    for prompt, reference in zip(prompts, references, strict=True):
        assert router_ok(router, keys["acme"], prompt)["output_ids"] == reference
