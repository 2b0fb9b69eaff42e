"""Isolation under load: concurrent tenants, memory pressure with quotas, disconnects and aborts.

Every request must be answered (no 5xx, no hang); no tenant may gain another's
cache; the server's own accounting (GET /iso/tenants) must show it, and the
positive controls (same-tenant hits) run in the same server.
"""

from __future__ import annotations

import http.client
import json
import string
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess
from sglang_iso_testing.tenants import write_tenants_file

from .conftest import start_iso_server

pytestmark = pytest.mark.e2e

TENANTS = ("acme", "globex", "initech", "umbrella", "latecomer")
QUOTA = 1200  # acme's resident-token cap
KEYS = {name: new_api_key() for name in (*TENANTS, "admin")}
_FIRST = iter(string.ascii_uppercase)


def prompt(words: int = 60) -> str:
    nonce = uuid.uuid4().hex
    return f"{next(_FIRST)} {nonce} " + " ".join(f"w{i}x{nonce[:4]}" for i in range(words))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    d: Path = tmp_path_factory.mktemp("pressure")
    tenants = {name: {"quota_tokens": QUOTA} if name == "acme" else {} for name in TENANTS}
    write_tenants_file(d, tenants, keys=KEYS, name="t.toml")
    # A small pool: quota eviction (acme) and LRU eviction happen during the module.
    srv = start_iso_server("--tenants-file", str(d / "t.toml"), "--max-total-tokens", "6144")
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def gen(server: ServerProcess, tenant: str, text: str, max_new: int = 2) -> dict:
    status, out = server.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}},
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout_s=300,
    )
    assert status == 200, (status, out)
    return out["meta_info"]


def tenant_stats(server: ServerProcess) -> dict:
    status, out = server.get_with("/iso/tenants", {"Authorization": f"Bearer {KEYS['admin']}"})
    assert status == 200, out
    return {name: info["ranks"][0] for name, info in out["tenants"].items()}


def wait_idle(server: ServerProcess, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    stats = tenant_stats(server)
    while time.monotonic() < deadline and any(s["protected_tokens"] for s in stats.values()):
        time.sleep(0.5)
        stats = tenant_stats(server)
    return stats


def test_concurrent_tenants_same_prompt_share_nothing(server: ServerProcess) -> None:
    shared_text = prompt()
    workers = ("acme", "globex", "initech", "umbrella")
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda t: (t, gen(server, t, shared_text)), [t for t in workers for _ in range(3)]))
    assert len(results) == 12
    # Each tenant stored its own copy: had one matched another's entry, it would not have needed to.
    stats = wait_idle(server)
    prompt_tokens = results[0][1]["prompt_tokens"]
    for tenant in workers:
        assert stats[tenant]["inserted_tokens"] >= prompt_tokens - 1, (tenant, stats[tenant])
        assert stats[tenant]["violations"] == 0
    # Each sender hits its own copy (positive control); a tenant that never sent it gets nothing,
    # although the copies are resident at its lookup (the match runs before its own allocation).
    assert gen(server, "globex", shared_text)["cached_tokens"] >= prompt_tokens - 1
    assert gen(server, "latecomer", shared_text)["cached_tokens"] == 0


def test_memory_pressure_and_quota(server: ServerProcess) -> None:
    texts = {t: [prompt(120) for _ in range(5)] for t in ("acme", "globex")}
    with ThreadPoolExecutor(max_workers=4) as pool:
        metas = list(pool.map(lambda tt: gen(server, tt[0], tt[1]), [(t, x) for t, xs in texts.items() for x in xs]))
    assert len(metas) == 10 and all(m["cached_tokens"] == 0 for m in metas)
    stats = wait_idle(server)
    assert stats["acme"]["resident_tokens"] <= QUOTA, stats["acme"]  # its own inserts evicted its own entries
    assert stats["acme"]["evicted_tokens"] > 0
    # The most recent prompt is still a hit (positive control for the quota and eviction path).
    assert gen(server, "globex", texts["globex"][-1])["cached_tokens"] > 0
    assert all(s["violations"] == 0 for s in stats.values())


def test_stream_disconnect_and_admin_abort_leave_no_locks(server: ServerProcess) -> None:
    host, port = "127.0.0.1", server.port
    body = json.dumps(
        {"text": prompt(), "stream": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    )
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request(
        "POST", "/generate", body, {"Authorization": f"Bearer {KEYS['acme']}", "Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    assert resp.status == 200
    resp.read(200)  # a few chunks, then walk away mid-generation
    conn.close()

    rid = f"abort-me-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(
            server.post,
            "/generate",
            {"text": prompt(), "rid": rid, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}},
            headers={"Authorization": f"Bearer {KEYS['globex']}"},
            timeout_s=300,
        )
        time.sleep(2.0)
        status, _ = server.post(
            "/abort_request", {"rid": f"globex.{rid}"}, headers={"Authorization": f"Bearer {KEYS['admin']}"}
        )
        assert status == 200
        status, out = pending.result(timeout=300)
    assert status in (200, 400), out  # an explicit answer either way, never a hang or 5xx
    if status == 200:
        assert out["meta_info"]["finish_reason"]["type"] in ("abort", "length")
    stats = wait_idle(server)
    assert all(s["protected_tokens"] == 0 for s in stats.values()), stats
    assert gen(server, "acme", "still serving")["completion_tokens"] == 2
