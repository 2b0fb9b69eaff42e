"""Tenants end to end: authentication, isolation with positive controls, sanitizing, admin paths.

One real server with a tenants file; every isolation assertion is paired with a
same-tenant cache hit in the same run (a server with caching off would fail it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess

from .conftest import start_iso_server
from .helpers import SHARED_SYSTEM_PROMPT, TENANTS, auth, generate, long_prompt, write_tenants_file

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in (*TENANTS, "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    path = write_tenants_file(tmp_path_factory.mktemp("tenants"), keys)
    srv = start_iso_server(
        "--tenants-file", str(path), "--enable-cache-report", "--enable-metrics",
        "--iso-audit-log", str(path.parent / "audit.jsonl"),
    )  # fmt: skip
    srv.audit_path = path.parent / "audit.jsonl"  # type: ignore[attr-defined]
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def test_missing_or_unknown_key_is_401_json(server: ServerProcess) -> None:
    for headers in ({}, auth("sk-iso-not-a-real-key"), {"Authorization": "Basic abc"}):
        status, out = server.post("/generate", {"text": "hi"}, headers=headers)
        assert status == 401
        assert out["error"]["code"] == "invalid_api_key"
    status, _ = server.get("/health")
    assert status == 200


def test_other_tenant_never_hits_same_tenant_does(server: ServerProcess, keys: dict[str, str]) -> None:
    prompt = long_prompt()
    first = generate(server, keys["acme"], prompt)
    again = generate(server, keys["acme"], prompt)
    other = generate(server, keys["globex"], prompt)
    other_again = generate(server, keys["globex"], prompt)
    assert first["cached_tokens"] == 0
    assert again["cached_tokens"] >= first["prompt_tokens"] - 1 > 0  # positive control
    assert other["cached_tokens"] == 0  # isolation
    assert other_again["cached_tokens"] >= first["prompt_tokens"] - 1  # globex's own entry


def test_chat_isolation_with_positive_control(server: ServerProcess, keys: dict[str, str]) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": long_prompt()}], "max_tokens": 2}

    def cached(key: str) -> int:
        status, out = server.post("/v1/chat/completions", body, headers=auth(key))
        assert status == 200, out
        return int(out["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached(keys["acme"]) == 0
    assert cached(keys["acme"]) > 0
    assert cached(keys["globex"]) == 0


def test_cache_salt_partitions_inside_the_tenant(server: ServerProcess, keys: dict[str, str]) -> None:
    prompt = long_prompt()
    generate(server, keys["acme"], prompt)
    salted = generate(server, keys["acme"], prompt, cache_salt="user-42")
    salted_again = generate(server, keys["acme"], prompt, cache_salt="user-42")
    unsalted = generate(server, keys["acme"], prompt)
    assert salted["cached_tokens"] == 0
    assert salted_again["cached_tokens"] > 0
    assert unsalted["cached_tokens"] > 0


def test_cache_off_tenant_never_reuses(server: ServerProcess, keys: dict[str, str]) -> None:
    prompt = long_prompt()
    assert generate(server, keys["initech"], prompt)["cached_tokens"] == 0
    assert generate(server, keys["initech"], prompt)["cached_tokens"] == 0
    # Positive control in the same run.
    generate(server, keys["acme"], prompt)
    assert generate(server, keys["acme"], prompt)["cached_tokens"] > 0


def test_group_members_share_outsiders_do_not(server: ServerProcess, keys: dict[str, str]) -> None:
    prompt = long_prompt()
    generate(server, keys["hooli"], prompt)
    assert generate(server, keys["hooli-eu"], prompt)["cached_tokens"] > 0
    assert generate(server, keys["acme"], prompt)["cached_tokens"] == 0


@pytest.mark.parametrize(
    "field,value",
    [("extra_key", "acme"), ("session_params", {"id": "x"}), ("custom_logit_processor", "x"), ("routed_dp_rank", 0)],
)
def test_forbidden_fields_are_400_naming_the_field(
    server: ServerProcess, keys: dict[str, str], field: str, value: object
) -> None:
    status, out = server.post("/generate", {"text": "hi", field: value}, headers=auth(keys["acme"]))
    assert status == 400
    assert out["error"]["param"] == field and field in out["error"]["message"]


def test_forbidden_header_is_400(server: ServerProcess, keys: dict[str, str]) -> None:
    status, out = server.post("/generate", {"text": "hi"}, headers={**auth(keys["acme"]), "x-data-parallel-rank": "0"})
    assert status == 400 and out["error"]["param"] == "x-data-parallel-rank"


def test_client_rid_is_namespaced(server: ServerProcess, keys: dict[str, str]) -> None:
    status, out = server.post(
        "/generate",
        {"text": "hi", "rid": "probe-1", "sampling_params": {"max_new_tokens": 1}},
        headers=auth(keys["acme"]),
    )
    assert status == 200, out
    assert out["meta_info"]["id"] == "acme.probe-1"


def test_admin_endpoints_need_the_admin_key(server: ServerProcess, keys: dict[str, str]) -> None:
    status, out = server.post("/flush_cache", {}, headers=auth(keys["acme"]))
    assert status == 403 and out["error"]["code"] == "admin_required"
    status, out = server.post("/generate", {"text": "hi"}, headers=auth(keys["admin"]))
    assert status == 403 and out["error"]["code"] == "tenant_key_required"
    status, _ = server.post("/flush_cache", {}, headers=auth(keys["admin"]))
    assert status == 200


def test_scheduler_saw_no_unverified_namespace(server: ServerProcess, keys: dict[str, str]) -> None:
    status, _ = server.post("/get_server_info", {}, headers=auth(keys["acme"]))
    assert status == 403
    from sglang_iso_testing.process import request_json

    status, info = request_json(server.base_url + "/get_server_info", None, headers=auth(keys["admin"]))
    assert status == 200
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    assert tree["namespace_mode"] == "tenants"
    assert tree["violations"] == 0


def test_collector_is_frozen_after_start_and_tenants_cannot_call_it(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    """SGLang's post-start ``/freeze_gc`` goes through the gate (with the in-memory internal key); a tenant's does
    not. Unfrozen, a full collection of the start-up heap stalled the HTTP process for most of a second."""
    from sglang_iso_testing.process import request_json

    status, info = request_json(server.base_url + "/get_server_info", None, headers=auth(keys["admin"]))
    assert status == 200
    assert info["internal_states"][0]["sglang_iso"]["gc_frozen_objects"] > 0
    log = server.log_text()
    assert '"POST /freeze_gc HTTP/1.1" 200' in log and "freeze_gc failed" not in log
    status, out = server.post("/freeze_gc", {}, headers=auth(keys["acme"]))
    assert status == 403 and out["error"]["code"] == "admin_required"
    status, out = server.post("/freeze_gc", {}, headers=auth("sk-iso-" + "0" * 40))
    assert status == 401
    assert generate(server, keys["acme"], long_prompt())["prompt_tokens"] > 0  # the tenant's own request is served


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_iso.launch_server", "--model-path", "m", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bad_tenants_file_is_a_startup_error_naming_the_field(tmp_path: Path, keys: dict[str, str]) -> None:
    path = write_tenants_file(tmp_path, keys)
    path.write_text(path.read_text().replace('id = "globex"', 'id = "Globex!"'))
    out = _launch("--tenants-file", str(path))
    assert out.returncode == 2
    assert "tenants[1].id" in out.stderr


def test_bypassing_flags_are_refused(tmp_path: Path, keys: dict[str, str]) -> None:
    path = write_tenants_file(tmp_path, keys)
    out = _launch("--tenants-file", str(path), "--api-key", "x")
    assert out.returncode == 2 and "--api-key" in out.stderr
    out = _launch("--tenants-file", str(path), "--tokenizer-worker-num", "2")
    assert out.returncode == 2 and "--tokenizer-worker-num" in out.stderr


def test_iso_tenants_reports_and_iso_flush_drops_one_tenant(server: ServerProcess, keys: dict[str, str]) -> None:
    acme_prompt, globex_prompt = long_prompt(), long_prompt()
    status, out = server.get_with("/iso/tenants", auth(keys["admin"]))
    assert status == 200, out
    served_before = {t: out["tenants"][t]["served"] for t in ("acme", "globex")}
    seen = {t: {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0} for t in ("acme", "globex")}
    for tenant, prompt in (("acme", acme_prompt), ("globex", globex_prompt)):
        for meta in (generate(server, keys[tenant], prompt), generate(server, keys[tenant], prompt)):
            seen[tenant]["requests"] += 1
            seen[tenant]["prompt_tokens"] += meta["prompt_tokens"]
            seen[tenant]["cached_tokens"] += meta["cached_tokens"]
        assert meta["cached_tokens"] > 0
    status, out = server.get_with("/iso/tenants", auth(keys["acme"]))
    assert status == 403
    status, out = server.get_with("/iso/tenants", auth(keys["admin"]))
    assert status == 200
    for tenant in ("acme", "globex"):  # what the admin API reports is what the clients were served
        served = out["tenants"][tenant]["served"]
        assert {k: served[k] - served_before[tenant][k] for k in seen[tenant]} == seen[tenant], (served, seen)
    acme = out["tenants"]["acme"]["ranks"][0]
    assert acme["resident_tokens"] > 0 and acme["lookup_hit_tokens"] > 0 and acme["violations"] == 0
    assert out["tenants"]["initech"]["cache"] == "off"

    status, out = server.post("/iso/flush", {"tenant": "nobody"}, headers=auth(keys["admin"]))
    assert status == 400 and out["error"]["param"] == "tenant"
    status, out = server.post("/iso/flush", {"tenant": "acme"}, headers=auth(keys["admin"]))
    assert status == 200 and out["flushed"] is True
    assert generate(server, keys["acme"], acme_prompt)["cached_tokens"] == 0  # acme's entries are gone
    assert generate(server, keys["globex"], globex_prompt)["cached_tokens"] > 0  # globex untouched


def test_declared_shared_prefix_is_shared_by_readers_only(server: ServerProcess, keys: dict[str, str]) -> None:
    def chat_cached(key: str, question: str) -> tuple[int, int]:
        body = {
            "model": "default",
            "messages": [{"role": "system", "content": SHARED_SYSTEM_PROMPT}, {"role": "user", "content": question}],
            "max_tokens": 1,
        }
        status, out = server.post("/v1/chat/completions", body, headers=auth(keys[key]))
        assert status == 200, out
        usage = out["usage"]
        return int(usage["prompt_tokens_details"]["cached_tokens"]), int(usage["prompt_tokens"])

    q_acme, q_globex = long_prompt(), long_prompt()
    chat_cached("acme", q_acme)  # the first reader supplies the shared KV
    shared_hit, prompt_len = chat_cached("globex", q_globex)
    assert shared_hit > 0  # positive control: another listed tenant reuses the declared prefix
    own_hit, _ = chat_cached("globex", q_globex)
    assert own_hit >= prompt_len - 1 > shared_hit  # globex's continuation is cached for globex...
    cross_hit, _ = chat_cached("acme", q_globex)
    # ...and acme gets the shared part plus at most the role marker of its own earlier
    # continuation ("<|user|>"; the questions differ from their first token on), never globex's question.
    assert shared_hit <= cross_hit <= shared_hit + 1
    outsider_hit, _ = chat_cached("hooli", long_prompt())
    assert outsider_hit == 0  # hooli is not a reader


def test_metrics_and_audit_log_per_tenant_without_prompt_text(server: ServerProcess, keys: dict[str, str]) -> None:
    secret_word = f"canary{uuid.uuid4().hex}"
    text = long_prompt() + " " + secret_word
    generate(server, keys["acme"], text)
    assert generate(server, keys["acme"], text)["cached_tokens"] > 0
    server.post("/generate", {"text": "x"}, headers=auth("sk-iso-nope"))
    time.sleep(1.5)  # the scheduler exports its counters at most once a second
    generate(server, keys["acme"], long_prompt())
    assert server.get("/metrics")[0] == 401  # it names every tenant: admin key only (--iso-metrics-auth admin)
    assert server.get_with("/metrics", auth(keys["acme"]))[0] == 403
    status, body = server.get_with("/metrics", auth(keys["admin"]))
    assert status == 200
    assert 'sglang_iso:cached_tokens_total{tenant="acme"}' in body
    assert 'sglang_iso:auth_failures_total{reason="unknown_key"}' in body
    assert 'sglang_iso:resident_tokens{tenant="acme"}' in body
    assert keys["acme"] not in body and secret_word not in body
    lines = [json.loads(line) for line in server.audit_path.read_text().splitlines()]  # type: ignore[attr-defined]
    hits = [e for e in lines if e["event"] == "cache_hit" and e["tenant"] == "acme"]
    assert hits and all(e["hit_tokens"] > 0 and e["namespace"] for e in hits)
    assert any(e["event"] == "auth_failure" for e in lines)
    assert any(e["event"] == "admin_action" for e in lines)  # /iso/* and /flush_cache calls earlier in the module
    raw = server.audit_path.read_text()  # type: ignore[attr-defined]
    assert secret_word not in raw and keys["acme"] not in raw


def test_weight_update_makes_old_entries_unreachable(server: ServerProcess, keys: dict[str, str]) -> None:
    from sglang_iso.models import tiny_model_path

    text = long_prompt()
    generate(server, keys["acme"], text)
    assert generate(server, keys["acme"], text)["cached_tokens"] > 0  # positive control before the update
    status, out = server.post(
        "/update_weights_from_disk",
        {"model_path": str(tiny_model_path()), "flush_cache": False},  # SGLang itself would keep the old KV
        headers=auth(keys["admin"]),
        timeout_s=300,
    )
    assert status == 200, out
    assert generate(server, keys["acme"], text)["cached_tokens"] == 0  # old weights' KV never matches again
    assert generate(server, keys["acme"], text)["cached_tokens"] > 0  # the new namespace caches normally
