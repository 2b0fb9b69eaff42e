"""Hierarchical cache per tenant on real servers (CPU): host tier (L2) and L3 files, per namespace.

Server 1 (small device pool, --enable-hierarchical-cache --hicache-storage-backend file):
tenant A's prompt is evicted to the host and the files by filler traffic; tenant
B sends the same prompt (no reuse from device, host or files), then A sends it
again (positive control: a hit loaded back from the host). Server 2, same
secret and directory: a tenant that sent nothing gets nothing, A hits from the files. Server 3, a new
secret, with NGRAM speculative decoding (Triton attention in its interpreter): A no longer hits the old
files (control: A's fresh prompt hits), and the host tier still serves A only, while drafts are verified.
A tenant flush drops its host and file pages (files under the old epoch stay unreachable); a tenant's host
and L3 quotas prune only its own pages. A declared shared prefix evicted to the host comes back for another of
its readers, never for a tenant that may not read it.
Three server starts for the module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso.server.hicache_args import UPSTREAM_DIR_ENV
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.plant import plant_env
from sglang_iso_testing.process import ServerProcess
from sglang_iso_testing.tenants import write_tenants_file

from .conftest import start_iso_server
from .helpers import assert_free_pages_zero

pytestmark = pytest.mark.e2e

KEYS = {name: new_api_key() for name in ("acme", "globex", "initech", "hooli", "umbrella", "admin")}
DEVICE_TOKENS = "2048"
SMALL_QUOTA = 96  # initech's host and L3 caps (tokens)
SHARED_TEXT = " ".join(f"Clause {i}: answer in full sentences and cite the manual." for i in range(6))


def shared_prefix_ids() -> list[int]:
    """The declared prefix as the server declares it: plain encoding, last token dropped (page size 1)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_model_path() / "tokenizer.json"))
    return tokenizer.encode(SHARED_TEXT, add_special_tokens=False).ids[:-1]


def prompt(words: int) -> str:
    nonce = uuid.uuid4().hex
    return f"{nonce} " + " ".join(f"w{i}x{nonce[:4]}" for i in range(words))


def write_tenants(d: Path) -> Path:
    tenants: dict[str, dict[str, object]] = {"hooli": {}, "acme": {}, "globex": {}, "umbrella": {}}
    tenants["initech"] = {"host_quota_tokens": SMALL_QUOTA, "l3_quota_tokens": SMALL_QUOTA}
    policy = {"name": "policy", "text": SHARED_TEXT, "tenants": ["acme", "initech"]}
    # NOTE: a new secret each call
    return write_tenants_file(d, tenants, keys=KEYS, shared_prefixes=[policy], name="t.toml").path


SHARED: dict[str, object] = {}  # what server 1 leaves for the restarts: target prompt, its length


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d: Path = tmp_path_factory.mktemp("hicache")
    write_tenants(d)
    (d / "l3").mkdir()
    return d


def start(workdir: Path, *extra: str, env: dict[str, str] | None = None) -> ServerProcess:
    return start_iso_server(
        "--tenants-file",
        str(workdir / "t.toml"),
        "--max-total-tokens",
        DEVICE_TOKENS,
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "file",
        "--enable-metrics",
        *extra,
        # NOTE: the test plugin answers the free-page check; it plants nothing unless armed
        env={UPSTREAM_DIR_ENV: str(workdir / "l3"), **plant_env(), **(env or {})},
    ).start(timeout_s=400)


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[ServerProcess]:
    srv = start(workdir)
    try:
        yield srv
    finally:
        srv.stop()


def gen(server: ServerProcess, tenant: str, text: str, new_tokens: int = 2) -> dict:
    status, out = server.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}},
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout_s=300,
    )
    assert status == 200, (status, out)
    return out["meta_info"]


def gen_ids(server: ServerProcess, tenant: str, ids: list[int]) -> dict:
    status, out = server.post(
        "/generate",
        {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}},
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout_s=300,
    )
    assert status == 200, (status, out)
    return out["meta_info"]


def tree_status(server: ServerProcess) -> dict:
    status, info = server.get_with("/get_server_info", {"Authorization": f"Bearer {KEYS['admin']}"})
    assert status == 200, info
    return info["internal_states"][0]["sglang_iso"]["tree_cache"]


def stats(server: ServerProcess, tenant_level: bool = False) -> dict:
    status, out = server.get_with("/iso/tenants", {"Authorization": f"Bearer {KEYS['admin']}"})
    assert status == 200, out
    if tenant_level:
        return out["tenants"]
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
    SHARED.update(target=target, n=n)
    # Filler from acme's own namespace pushes the target out of the 2,048-token device pool.
    for _ in range(8):
        gen(server, "acme", prompt(50))
    evicted = wait_for(server, lambda s: s["acme"].get("host_resident_tokens", 0) >= n // 2)
    assert evicted["acme"]["host_resident_tokens"] >= n // 2, evicted
    assert evicted["acme"]["l3_written_tokens"] >= n // 2, evicted  # written through to the files too

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
    assert tree["l3_written_pages"] > 0 and tree["l3_bad_files"] == 0, tree

    time.sleep(1.5)  # the scheduler exports its counters at most once a second
    gen(server, "acme", prompt(5))
    status, body = server.get_with("/metrics", {"Authorization": f"Bearer {KEYS['admin']}"})
    assert status == 200
    assert 'sglang_iso:host_resident_tokens{tenant="acme"}' in body
    assert 'sglang_iso:tier_loaded_tokens_total{tenant="acme",tier="host"}' in body
    assert 'tier_loaded_tokens_total{tenant="globex"' not in body


def test_tenant_flush_drops_host_and_file_pages(server: ServerProcess) -> None:
    target, n = str(SHARED["target"]), int(SHARED["n"])
    status, out = server.post("/iso/flush", {"tenant": "acme"}, headers={"Authorization": f"Bearer {KEYS['admin']}"})
    assert status == 200, out
    assert gen(server, "acme", target)["cached_tokens"] == 0  # device, host and files: all gone for acme
    # Push it out again: written to the host and to files under the new (persisted) flush epoch, which the
    # restart test then reads back.
    for _ in range(8):
        gen(server, "acme", prompt(50))
    spilled = wait_for(server, lambda s: s["acme"].get("host_resident_tokens", 0) >= n // 2)
    assert spilled["acme"]["host_resident_tokens"] >= n // 2, spilled
    assert gen(server, "acme", target)["cached_tokens"] >= n // 2  # control: reachable again after the refill
    for _ in range(8):
        gen(server, "acme", prompt(50))


def test_tenant_tier_quotas_are_enforced_and_reported(server: ServerProcess) -> None:
    # initech alone pushes its own prompts out of the device: host and L3 keep at most its quota, the rest of
    # its oldest pages are pruned; acme's files (read back after the restart below) are untouched.
    mine = [prompt(50) for _ in range(16)]
    for text in mine:
        gen(server, "initech", text)
    row = wait_for(server, lambda s: s["initech"].get("l3_pruned_tokens", 0) > 0)["initech"]
    assert row["l3_pruned_tokens"] > 0 and 0 < row["l3_resident_tokens"] <= SMALL_QUOTA, row
    assert 0 < row["host_resident_tokens"] <= SMALL_QUOTA, row
    assert (row["host_quota_tokens"], row["l3_quota_tokens"]) == (SMALL_QUOTA, SMALL_QUOTA), row
    acme = stats(server)["acme"]
    assert acme.get("l3_pruned_tokens", 0) == 0 and acme.get("l3_quota_tokens") is None, acme
    configured = stats(server, tenant_level=True)
    assert configured["initech"]["l3_quota_tokens"] == SMALL_QUOTA and configured["acme"]["host_quota_tokens"] is None
    time.sleep(1.5)  # the scheduler exports its counters at most once a second
    gen(server, "initech", prompt(5))
    status, body = server.get_with("/metrics", {"Authorization": f"Bearer {KEYS['admin']}"})
    assert status == 200
    assert 'sglang_iso:l3_resident_tokens{tenant="initech"}' in body
    assert 'sglang_iso:tier_quota_tokens{tenant="initech",tier="l3"} 96.0' in body
    assert 'sglang_iso:l3_pruned_tokens_total{tenant="initech"}' in body


def test_shared_prefix_returns_from_the_host_for_its_readers_only(server: ServerProcess) -> None:
    shared = shared_prefix_ids()

    def own(seed: int) -> list[int]:
        return [300 + (seed * 7919 + i * 104729) % 1500 for i in range(24)]

    gen_ids(server, "acme", shared + own(1))  # fills the shared prefix, then acme's continuation
    # acme's own traffic pushes both out: the continuation under acme, the prefix under its own namespace.
    for _ in range(16):
        if tree_status(server)["host_shared_resident_tokens"] >= len(shared):
            break
        gen(server, "acme", prompt(50))
    before = tree_status(server)
    assert before["host_shared_resident_tokens"] >= len(shared), before
    assert gen_ids(server, "globex", shared + own(2))["cached_tokens"] == 0  # not a reader: nothing
    assert tree_status(server)["host_shared_loaded_tokens"] == before["host_shared_loaded_tokens"]
    hit = gen_ids(server, "initech", shared + own(3))  # another reader: the prefix comes back from the host
    assert hit["cached_tokens"] >= len(shared), hit
    after = tree_status(server)
    assert after["host_shared_loaded_tokens"] >= before["host_shared_loaded_tokens"] + len(shared), after
    assert after["host_violations"] == 0 and after["owner_violations"] == 0, after


def test_erase_drops_every_tier_and_the_receipt_counts_what_each_held(workdir: Path, server: ServerProcess) -> None:
    """``POST /iso/tenants/umbrella/erase`` with umbrella's KV on the device, in host pages and in files: the receipt's
    counts equal what /iso/tenants showed each tier holding, the files are gone from the directory, every free
    device page is zero (the test plugin's check, with its self-test), umbrella misses in every tier afterwards,
    and globex's own spilled prompt still hits (control)."""
    admin = {"Authorization": f"Bearer {KEYS['admin']}"}
    mine, theirs = prompt(50), prompt(50)
    n = int(gen(server, "umbrella", mine)["prompt_tokens"])
    gen(server, "globex", theirs)
    for _ in range(8):  # umbrella's own filler pushes both prompts to the host and the files
        gen(server, "umbrella", prompt(50))
    held = wait_for(server, lambda s: s["umbrella"].get("l3_resident_tokens", 0) >= n // 2)["umbrella"]
    assert held["host_resident_tokens"] >= n // 2 and held["resident_tokens"] > 0, held
    files_before = len(list((workdir / "l3").glob("*.kv")))

    status, receipt = server.post("/iso/tenants/umbrella/erase", {}, headers=admin)
    assert status == 200 and receipt["erased"] and receipt["complete"], receipt
    totals = receipt["totals"]
    assert totals["device_tokens_dropped"] == held["resident_tokens"], (totals, held)
    assert totals["host_tokens_dropped"] == held["host_resident_tokens"], (totals, held)
    assert totals["l3_files_deleted"] > 0 and totals["device_pages_scrubbed"] > 0, totals
    assert len(list((workdir / "l3").glob("*.kv"))) == files_before - totals["l3_files_deleted"]
    after = stats(server)["umbrella"]
    assert after["resident_tokens"] == after["host_resident_tokens"] == after["l3_resident_tokens"] == 0, after

    assert_free_pages_zero(server, KEYS["admin"])
    assert gen(server, "umbrella", mine)["cached_tokens"] == 0  # device, host and files: all gone
    assert gen(server, "globex", theirs)["cached_tokens"] >= n // 2  # control: globex's own, from its tier


def test_restart_same_secret_hits_from_files_for_its_tenant_only(workdir: Path, server: ServerProcess) -> None:
    assert SHARED, "needs the first test's target prompt"
    server.stop()  # server 1 is done; its pages are in the files
    target, n = str(SHARED["target"]), int(SHARED["n"])
    srv = start(workdir)
    try:
        # NOTE: a tenant that sent nothing to server 1: the others' own files may share a first token with the
        # target (its nonce), a legitimate one-token hit of their own.
        assert gen(srv, "hooli", target)["cached_tokens"] == 0  # nothing from A's files
        again = gen(srv, "acme", target)  # positive control: A hits from the files after the restart
        assert again["cached_tokens"] >= n // 2, again
        loaded = wait_for(srv, lambda s: s["acme"].get("l3_loaded_tokens", 0) > 0)
        assert loaded["acme"]["l3_loaded_tokens"] >= n // 2, loaded
        assert loaded.get("hooli", {}).get("l3_loaded_tokens", 0) == 0
    finally:
        srv.stop()


def test_a_server_killed_mid_traffic_restarts_on_its_files_without_a_torn_page(
    workdir: Path, server: ServerProcess
) -> None:
    """SIGKILL of every server process while it evicts pages into the files, then the crash residue a power loss
    adds (a torn page file, a killed writer's temporary file): the restarted server removes the temporary file,
    loads no torn page (a counted miss), and the owner's answer from its files equals the one computed before."""
    assert SHARED, "needs the first test's target prompt"
    server.stop()
    target = str(SHARED["target"])
    srv = start(workdir)
    try:

        def answer(s: ServerProcess) -> tuple[list[int], int]:
            status, out = s.post(
                "/generate",
                {"text": target, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}},
                headers={"Authorization": f"Bearer {KEYS['acme']}"},
                timeout_s=300,
            )
            assert status == 200, out
            return list(out["output_ids"]), int(out["meta_info"]["cached_tokens"])

        reference, _ = answer(srv)

        def traffic(i: int) -> None:
            with contextlib.suppress(Exception):  # NOTE: the kill cuts these requests off
                srv.post("/generate", {"text": prompt(50), "sampling_params": {"max_new_tokens": 4}},
                         headers={"Authorization": f"Bearer {KEYS['globex']}"}, timeout_s=60)  # fmt: skip

        with ThreadPoolExecutor(max_workers=4) as pool:
            for i in range(16):
                pool.submit(traffic, i)
            time.sleep(4)
            assert srv.proc is not None
            os.killpg(srv.proc.pid, signal.SIGKILL)
    finally:
        srv.stop()
    files = sorted((workdir / "l3").glob("*.kv"))
    assert files, "no page files were written"
    torn = files[len(files) // 2]
    torn.write_bytes(torn.read_bytes()[:100])
    residue = workdir / "l3" / ".tmp-killedwriter"
    residue.write_bytes(b"\x00" * 512)
    old = time.time() - 3600
    os.utime(residue, (old, old))
    srv = start(workdir)
    try:
        again, cached = answer(srv)
        assert cached > 0 and again == reference  # positive control: acme's own files serve it, identically
        tree = tree_status(srv)
        assert tree["l3_partial_removed"] == 1 and not residue.exists(), tree
        assert tree["l3_foreign_files"] >= 1 and tree["host_violations"] == 0, tree  # the torn file: never loaded
        assert gen(srv, "hooli", target)["cached_tokens"] == 0
    finally:
        srv.stop()


def test_new_secret_makes_old_files_unreachable_and_tiers_hold_with_ngram(workdir: Path, server: ServerProcess) -> None:
    assert SHARED, "needs the first test's target prompt"
    server.stop()
    write_tenants(workdir)  # rotate the namespace secret
    target = str(SHARED["target"])
    # NOTE: NGRAM needs the Triton attention backend (the interpreter on CPU): the host tier's copies and the
    # owner check then run beside draft verification.
    srv = start(
        workdir,
        *("--attention-backend", "triton", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"),
        env={"TRITON_INTERPRET": "1"},
    )
    try:
        assert gen(srv, "acme", target)["cached_tokens"] == 0
        fresh = prompt(50)
        gen(srv, "acme", fresh)
        assert gen(srv, "acme", fresh)["cached_tokens"] > 0  # control: caching works on this server
        assert stats(srv)["acme"].get("l3_loaded_tokens", 0) == 0
        # Push acme's fresh prompt out to the host (least recently used first: everything inserted so far).
        inserted = int(stats(srv)["acme"]["inserted_tokens"])
        for _ in range(16):
            if int(stats(srv)["acme"]["evicted_tokens"]) >= inserted:
                break
            gen(srv, "acme", prompt(50))
        assert int(stats(srv)["acme"]["evicted_tokens"]) >= inserted
        assert gen(srv, "globex", fresh, new_tokens=8)["cached_tokens"] == 0  # B: nothing from A's host pages
        loaded_before = int(stats(srv)["acme"]["host_loaded_tokens"])
        again = gen(srv, "acme", fresh, new_tokens=8)  # positive control: back from the host, then speculated
        assert again["cached_tokens"] > 0 and again["spec_verify_ct"] > 0, again
        after = stats(srv)
        assert after["acme"]["host_loaded_tokens"] > loaded_before, after
        assert after.get("globex", {}).get("host_loaded_tokens", 0) == 0
        status, info = srv.get_with("/get_server_info", {"Authorization": f"Bearer {KEYS['admin']}"})
        assert status == 200
        tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
        assert tree["host_violations"] == 0 and tree["owner_violations"] == 0, tree
    finally:
        srv.stop()
