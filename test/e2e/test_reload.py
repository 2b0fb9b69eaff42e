"""SIGHUP reloads the tenants file: key rotation and new tenants, no request in flight dropped; a removed tenant's
cache is erased."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.tenants import write_tenants_file

from .conftest import start_iso_server
from .helpers import assert_free_pages_zero, audit_events, plant_env

pytestmark = pytest.mark.e2e


def test_sighup_rotates_keys_and_adds_tenants(tmp_path: Path) -> None:
    old, new, newco, admin = new_api_key(), new_api_key(), new_api_key(), new_api_key()
    made = write_tenants_file(tmp_path, ["acme"], keys={"acme": old, "admin": admin})
    path = made.path

    def tenants_toml(entries: dict[str, list[str]]) -> str:
        """The file's text with these tenants and keys (same secret and admin key): what an operator edits."""
        staged = tmp_path / "staged"
        staged.mkdir(exist_ok=True)
        keys: dict[str, str | list[str]] = {**entries, "admin": admin}
        return write_tenants_file(staged, list(entries), keys=keys, secret=made.secret).path.read_text()

    audit_log = tmp_path / "audit.jsonl"
    server = start_iso_server("--tenants-file", str(path), "--iso-audit-log", str(audit_log), env=plant_env())
    try:
        server.start()

        def gen(key: str, n: int = 2) -> int:
            status, _ = server.post(
                "/generate",
                {"text": "hello there", "sampling_params": {"max_new_tokens": n, "ignore_eos": True}},
                headers={"Authorization": f"Bearer {key}"},
                timeout_s=300,
            )
            return status

        def reload(text: str) -> None:
            path.write_text(text)
            assert server.proc is not None
            server.proc.send_signal(signal.SIGHUP)
            time.sleep(1.0)

        assert gen(old) == 200 and gen(new) == 401 and gen(newco) == 401
        with ThreadPoolExecutor(max_workers=1) as pool:
            in_flight = pool.submit(gen, old, 150)  # still running while the file changes
            time.sleep(0.5)
            reload(tenants_toml({"acme": [old, new], "newco": [newco]}))  # step 1: add the new key
            assert in_flight.result(timeout=300) == 200
        assert gen(old) == 200 and gen(new) == 200 and gen(newco) == 200
        reload(tenants_toml({"acme": [new], "newco": [newco]}))  # step 2: retire the old key
        assert gen(old) == 401 and gen(new) == 200
        reload("this is [not valid toml")  # a broken file is rejected; the running config stays
        assert gen(new) == 200 and gen(newco) == 200
        assert "tenants file reload rejected" in server.log_text()

        def resident(owner: str) -> int:
            status, info = server.get_with("/get_server_info", {"Authorization": f"Bearer {admin}"})
            assert status == 200, info
            row = info["internal_states"][0]["sglang_iso"]["tenants"].get(owner) or {}
            return int(row.get("resident_tokens") or 0)

        held = resident("newco")
        assert held > 0 and resident("acme") > 0
        reload(tenants_toml({"acme": [new]}))  # step 3: newco leaves; its cache must not outlive it
        deadline = time.monotonic() + 30
        while not audit_events(audit_log, "tenant_removed_erased"):
            assert time.monotonic() < deadline, "the removed tenant's cache was not erased"
            time.sleep(0.5)
        (receipt,) = audit_events(audit_log, "tenant_removed_erased")
        assert receipt["namespace_owner"] == "newco" and receipt["complete"], receipt
        assert receipt["totals"]["device_tokens_dropped"] == held, (receipt, held)  # what it held, all of it
        assert receipt["totals"]["device_pages_scrubbed"] > 0, receipt
        assert gen(newco) == 401 and resident("newco") == 0
        assert_free_pages_zero(server, admin)
        assert resident("acme") > 0  # control: the tenant that stays keeps its cache
    finally:
        server.stop()


def test_ten_thousand_tenants_reload_under_load_without_a_dropped_or_misattributed_request(tmp_path: Path) -> None:
    tenants = [f"t{i:05d}" for i in range(10_000)]
    made = write_tenants_file(tmp_path, tenants)
    server = start_iso_server("--tenants-file", str(made.path))
    clients = tenants[::1250]  # 8 tenants from all over the file
    stop = threading.Event()
    results: list[tuple[str, str, int, object]] = []

    def client(tenant: str) -> None:
        auth = {"Authorization": f"Bearer {made.keys[tenant]}"}
        while not stop.is_set():
            rid = uuid.uuid4().hex
            body = {"text": f"{tenant} asks again", "rid": rid, "sampling_params": {"max_new_tokens": 4}}
            status, out = server.post("/generate", body, headers=auth, timeout_s=300)
            results.append((tenant, rid, status, out["meta_info"]["id"] if status == 200 else out))

    try:
        server.start()
        with ThreadPoolExecutor(max_workers=len(clients)) as pool:
            running = [pool.submit(client, tenant) for tenant in clients]
            for i in range(3):
                time.sleep(3)
                keys: dict[str, str | list[str]] = dict(made.keys)
                latest = write_tenants_file(tmp_path, [*tenants, f"new{i}"], keys=keys, secret=made.secret)
                assert server.proc is not None
                server.proc.send_signal(signal.SIGHUP)
                deadline = time.monotonic() + 60
                while server.log_text().count("tenants file reloaded: 10001 tenants") < i + 1:
                    assert time.monotonic() < deadline, "reload not applied"
                    time.sleep(0.2)
            time.sleep(2)
            stop.set()
            for future in running:
                future.result(timeout=300)
        assert len(results) > 3 * len(clients)
        dropped = [r for r in results if r[2] != 200]
        assert dropped == [], dropped[:5]
        misattributed = [r for r in results if r[3] != f"{r[0]}.{r[1]}"]  # the gate prefixes rids with the tenant
        assert misattributed == [], misattributed[:5]
        added, _ = server.post("/generate", {"text": "x"}, headers={"Authorization": f"Bearer {latest.keys['new2']}"})
        unknown, _ = server.post("/generate", {"text": "x"}, headers={"Authorization": "Bearer sk-iso-unknown"})
        assert (added, unknown) == (200, 401)  # control: the last reload's tenant is served, an unknown key is not
    finally:
        stop.set()
        server.stop()
