"""Retention and erasure on a real server: an idle tenant's cache goes after its ``cache_ttl_seconds``, others stay.

``acme`` has a 3-second idle retention and ``globex`` none, in one server. Before the limit acme hits its own
prefix (positive control); after it, acme misses, holds no resident tokens and the drop is reported and audited,
while globex, idle just as long, still hits. At start acme counts as just used (what L3 kept from before a restart
must go one limit later), so the module first waits for that drop. ``POST /iso/tenants/{id}/erase`` drops one
tenant's cache at once and answers with a receipt of what each tier held.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso_testing.process import ServerProcess
from sglang_iso_testing.tenants import TenantsFile, write_tenants_file

from .conftest import start_iso_server
from .helpers import assert_free_pages_zero, audit_events, auth, generate, long_prompt, plant_env

pytestmark = pytest.mark.e2e

TTL_S = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, TenantsFile, Path]]:
    directory = tmp_path_factory.mktemp("retention")
    made = write_tenants_file(directory, {"acme": {"cache_ttl_seconds": TTL_S}, "globex": {}, "initech": {}})
    audit_log = directory / "audit.jsonl"
    server = start_iso_server("--tenants-file", str(made.path), "--iso-audit-log", str(audit_log), env=plant_env())
    try:
        server.start()
        _wait_for_drop(server, made, 0)  # at start acme counts as just used: one drop a TTL later
        yield server, made, audit_log
    finally:
        server.stop()


def _tenants(server: ServerProcess, made: TenantsFile) -> dict:
    status, out = server.get_with("/iso/tenants", auth(made.keys["admin"]))
    assert status == 200, out
    return out["tenants"]


def _wait_for_drop(server: ServerProcess, made: TenantsFile, seen: int) -> None:
    deadline = time.monotonic() + TTL_S + 20
    while _tenants(server, made)["acme"]["retention"]["expired_idle"] == seen:
        assert time.monotonic() < deadline, "acme's cache was not dropped after its idle retention"
        time.sleep(0.5)


def test_an_idle_tenants_cache_is_dropped_after_its_ttl_and_only_its(
    setup: tuple[ServerProcess, TenantsFile, Path],
) -> None:
    server, made, audit_log = setup
    before = _tenants(server, made)["acme"]["retention"]["expired_idle"]
    acme_text, globex_text = long_prompt(), long_prompt()
    for key, text in ((made.keys["acme"], acme_text), (made.keys["globex"], globex_text)):
        generate(server, key, text)
        assert generate(server, key, text)["cached_tokens"] > 0  # positive control: reuse before the limit
    rows = _tenants(server, made)
    assert rows["acme"]["retention"]["cache_ttl_seconds"] == TTL_S
    assert rows["globex"]["retention"]["cache_ttl_seconds"] is None
    held = rows["acme"]["ranks"][0]["resident_tokens"]
    assert held > 0

    _wait_for_drop(server, made, before)
    rows = _tenants(server, made)
    assert rows["acme"]["ranks"][0]["resident_tokens"] == 0
    assert rows["globex"]["retention"]["expired_idle"] == 0 and rows["globex"]["ranks"][0]["resident_tokens"] > 0
    expired = audit_events(audit_log, "cache_expired")
    assert expired and all(e["owner"] == "acme" and e["reason"] == "idle" for e in expired), expired
    totals = expired[-1]["totals"]  # the receipt of this drop: what acme held, erased, its pages zeroed
    assert expired[-1]["complete"] and totals["device_tokens_dropped"] == held, (totals, held)
    assert totals["device_pages_scrubbed"] > 0 and totals["device_tokens_held"] == 0, totals
    assert_free_pages_zero(server, made.keys["admin"])

    assert generate(server, made.keys["acme"], acme_text)["cached_tokens"] == 0  # dropped: a miss
    assert generate(server, made.keys["globex"], globex_text)["cached_tokens"] > 0  # control: globex unaffected
    assert generate(server, made.keys["acme"], acme_text)["cached_tokens"] > 0  # acme caches again afterwards


def test_erase_drops_one_tenants_cache_with_a_receipt(setup: tuple[ServerProcess, TenantsFile, Path]) -> None:
    server, made, audit_log = setup
    admin = auth(made.keys["admin"])
    globex_text, globex_other = long_prompt(), long_prompt()
    generate(server, made.keys["globex"], globex_text)
    assert generate(server, made.keys["globex"], globex_text)["cached_tokens"] > 0  # positive control
    generate(server, made.keys["initech"], globex_other)  # initech's own (no retention limit)

    status, out = server.post("/iso/tenants/globex/erase", {}, headers=auth(made.keys["globex"]))
    assert status == 403, out  # a tenant key cannot erase, not even its own cache
    status, out = server.post("/iso/tenants/nobody/erase", {}, headers=admin)
    assert status == 404 and out["error"]["param"] == "tenant", out
    assert generate(server, made.keys["globex"], globex_text)["cached_tokens"] > 0  # refused: nothing dropped

    status, receipt = server.post("/iso/tenants/globex/erase", {}, headers=admin)
    assert status == 200 and receipt["erased"] and receipt["complete"], receipt
    assert receipt["tenant"] == "globex" and receipt["totals"]["device_tokens_dropped"] > 0, receipt
    assert receipt["totals"]["device_tokens_held"] == 0 and receipt["totals"]["device_pages_scrubbed"] > 0, receipt
    assert _tenants(server, made)["globex"]["ranks"][0]["resident_tokens"] == 0
    assert_free_pages_zero(server, made.keys["admin"])
    assert generate(server, made.keys["globex"], globex_text)["cached_tokens"] == 0  # erased: a miss
    assert generate(server, made.keys["initech"], globex_other)["cached_tokens"] > 0  # control: initech keeps its own
    erased = audit_events(audit_log, "tenant_erased")
    assert [e["receipt_id"] for e in erased] == [receipt["receipt_id"]] and erased[0]["totals"] == receipt["totals"]


def test_the_evidence_report_reads_the_live_server(setup: tuple[ServerProcess, TenantsFile, Path]) -> None:
    """``sglang-iso evidence`` against this server: its isolation counters pass, retention is reported as not
    configured for the tenants without limits, and what needs test results is marked not shown."""
    from sglang_iso.audit import evidence
    from sglang_iso.tenancy.config import load_tenants_file

    server, made, _ = setup
    generate(server, made.keys["initech"], long_prompt())  # something served, so hits are attributed
    live = evidence.fetch_server(server.base_url, made.keys["admin"])
    report = evidence.build(load_tenants_file(made.path), server=live)
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert statuses == {"E1": "pass", "E2": "pass", "E3": "pass", "E4": "not shown", "E5": "pass",
                        "E6": "not configured"}, report["checks"]  # fmt: skip
    with pytest.raises(OSError, match="HTTP 403"):
        evidence.fetch_server(server.base_url, made.keys["initech"])  # a tenant key reads no counters


def test_a_request_shortens_its_own_retention_and_only_its_owners(
    setup: tuple[ServerProcess, TenantsFile, Path],
) -> None:
    """``X-Cache-TTL-Seconds``: initech (no configured limit) asks for 2 s on a request; its cache goes 2 s after
    it was last used, while globex (no limit, idle as long) keeps hitting; a bad value is a 400 naming the header
    and changes nothing."""
    server, made, audit_log = setup
    initech, globex = auth(made.keys["initech"]), made.keys["globex"]
    initech_text, globex_text = long_prompt(), long_prompt()
    generate(server, globex, globex_text)
    status, out = server.post("/generate", {"text": initech_text}, headers={**initech, "X-Cache-TTL-Seconds": "0"})
    assert status == 400 and out["error"]["param"] == "x-cache-ttl-seconds", out
    assert _tenants(server, made)["initech"]["retention"]["asked_ttl_seconds"] is None  # refused: nothing asked
    body = {"text": initech_text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    status, out = server.post("/generate", body, headers={**initech, "X-Cache-TTL-Seconds": "2"})
    assert status == 200, out
    assert generate(server, made.keys["initech"], initech_text)["cached_tokens"] > 0  # positive control: still cached
    assert _tenants(server, made)["initech"]["retention"]["asked_ttl_seconds"] == 2

    deadline = time.monotonic() + 30
    while _tenants(server, made)["initech"]["retention"]["expired_idle"] == 0:
        assert time.monotonic() < deadline, "initech's cache was not dropped after the retention it asked for"
        time.sleep(0.5)
    rows = _tenants(server, made)
    assert rows["initech"]["ranks"][0]["resident_tokens"] == 0
    assert rows["initech"]["retention"]["asked_ttl_seconds"] is None  # the ask ended with the drop
    assert generate(server, made.keys["initech"], initech_text)["cached_tokens"] == 0  # dropped: a miss
    assert generate(server, globex, globex_text)["cached_tokens"] > 0  # control: globex unaffected
    assert any(e["owner"] == "initech" for e in audit_events(audit_log, "cache_expired"))
