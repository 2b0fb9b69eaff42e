"""Hierarchical cache per tenant on a real server (CPU): host tier (L2) per namespace, L3 refused.

A small device pool: tenant A's prompt is evicted to the host by filler
traffic, then tenant B sends the same prompt (no reuse: its namespace has
nothing, on the device or the host) and A sends it again (positive control: a
hit served from the host, counted as loaded back). One server for the module,
plus one refused start for L3 storage.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso.server.process import ServerProcess, ServerStartError
from sglang_iso.tenancy.keys import key_sha256, new_api_key

from .conftest import start_iso_server

pytestmark = pytest.mark.e2e

KEYS = {name: new_api_key() for name in ("acme", "globex", "admin")}
DEVICE_TOKENS = "2048"


def prompt(words: int) -> str:
    nonce = uuid.uuid4().hex
    return f"{nonce} " + " ".join(f"w{i}x{nonce[:4]}" for i in range(words))


def write_tenants(d: Path) -> Path:
    (d / "s.key").write_bytes(secrets.token_bytes(32))
    lines = ['namespace_secret_file = "s.key"', f'admin_key_sha256 = ["{key_sha256(KEYS["admin"])}"]']
    for name in ("acme", "globex"):
        lines += ["[[tenants]]", f'id = "{name}"', f'key_sha256 = ["{key_sha256(KEYS[name])}"]']
    (d / "t.toml").write_text("\n".join(lines) + "\n")
    return d / "t.toml"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tenants = write_tenants(tmp_path_factory.mktemp("hicache"))
    srv = start_iso_server(
        "--tenants-file", str(tenants), "--max-total-tokens", DEVICE_TOKENS, "--enable-hierarchical-cache"
    )
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def gen(server: ServerProcess, tenant: str, text: str) -> dict:
    status, out = server.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout_s=300,
    )
    assert status == 200, (status, out)
    return out["meta_info"]


def stats(server: ServerProcess) -> dict:
    status, out = server.get_with("/iso/tenants", {"Authorization": f"Bearer {KEYS['admin']}"})
    assert status == 200, out
    return {name: (info["ranks"][0] if info["ranks"] else {}) for name, info in out["tenants"].items()}


def wait_for(server: ServerProcess, check, timeout_s: float = 30.0) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        now = stats(server)
        if check(now) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def test_evicted_prefix_returns_from_host_for_its_tenant_only(server: ServerProcess) -> None:
    target = prompt(50)
    first = gen(server, "acme", target)
    assert first["cached_tokens"] == 0
    n = int(first["prompt_tokens"])
    # Filler from acme's own namespace pushes the target out of the 2,048-token device pool.
    for _ in range(8):
        gen(server, "acme", prompt(50))
    evicted = wait_for(server, lambda s: s["acme"].get("host_resident_tokens", 0) >= n // 2)
    assert evicted["acme"]["host_resident_tokens"] >= n // 2, evicted

    other = gen(server, "globex", target)
    assert other["cached_tokens"] == 0  # B: no reuse from A's device or host pages
    loaded_before = int(stats(server)["acme"]["host_loaded_tokens"])

    again = gen(server, "acme", target)  # positive control, same run
    assert again["cached_tokens"] >= n // 2, again
    after = wait_for(server, lambda s: s["acme"]["host_loaded_tokens"] > loaded_before)
    assert after["acme"]["host_loaded_tokens"] > loaded_before  # the hit came back from the host
    assert after.get("globex", {}).get("host_loaded_tokens", 0) == 0

    status, info = server.get_with("/get_server_info", {"Authorization": f"Bearer {KEYS['admin']}"})
    assert status == 200
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    assert tree["host_scrubbed_pages"] > 0 and tree["host_violations"] == 0, tree


def test_l3_storage_is_refused_with_a_message(tmp_path: Path) -> None:
    tenants = write_tenants(tmp_path)
    srv = start_iso_server(
        "--tenants-file",
        str(tenants),
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "file",
    )
    with pytest.raises(ServerStartError) as err:
        srv.start(timeout_s=240)
    srv.keep_log = False  # an expected refusal: its log tail is in the error
    srv.stop()
    assert "--hicache-storage-backend file" in str(err.value)
