"""Where users meet sglang-iso: SGLang's frontend language and the OpenAI SDK, with tenant keys.

One real server with a two-tenant file runs the programs of examples/frontend_tenant.py and
examples/openai_tenant.py in-process, and the examples themselves as scripts. Every isolation check
sits next to a same-tenant cache hit in the same run (the positive control).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import openai
import pytest
import sglang as sgl

from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess

from .conftest import start_iso_server
from .helpers import TWO_TENANTS, auth, generate, long_prompt, write_two_tenants_file

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PROGRAMS = Path(__file__).resolve().parent / "programs"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"sglang_iso_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"{name=}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in (*TWO_TENANTS, "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    path = write_two_tenants_file(tmp_path_factory.mktemp("tenants"), keys)
    srv = start_iso_server("--tenants-file", str(path), "--enable-cache-report")
    try:
        srv.start(timeout_s=300)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def frontend() -> ModuleType:
    return load_example("frontend_tenant")


@pytest.fixture(scope="module")
def oai() -> ModuleType:
    return load_example("openai_tenant")


@pytest.fixture(scope="module")
def acme(server: ServerProcess, keys: dict[str, str], frontend: ModuleType) -> sgl.RuntimeEndpoint:
    return frontend.connect(server.base_url, keys["acme"])


# --- SGLang frontend language -------------------------------------------------------------------------


def test_runtime_endpoint_needs_a_known_key(server: ServerProcess, frontend: ModuleType) -> None:
    for key in (None, "sk-iso-not-a-real-key"):
        with pytest.raises(RuntimeError, match="invalid_api_key"):
            frontend.connect(server.base_url, key)


def test_chat_roles_and_default_backend(server: ServerProcess, keys: dict[str, str], frontend: ModuleType) -> None:
    sgl.set_default_backend(frontend.connect(server.base_url, keys["globex"]))
    try:
        state = frontend.support_turn.run(question="Where is my parcel?", max_tokens=5)
    finally:
        sgl.global_config.default_backend = None
    assert state.error() is None
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]
    assert isinstance(state["answer"], str)
    assert state.get_meta_info("answer")["completion_tokens"] == 5


def test_select_stream_and_run_batch(acme: sgl.RuntimeEndpoint, frontend: ModuleType) -> None:
    label = frontend.triage.run(ticket="charged twice", backend=acme)["label"]
    assert label in ("billing", "shipping", "other")
    streamed = list(frontend.support_turn.run(question="Hi", stream=True, backend=acme).text_iter("answer"))
    assert streamed and all(isinstance(part, str) for part in streamed)
    batch = frontend.support_turn.run_batch(
        [{"question": f"question {i}"} for i in range(3)], backend=acme, num_threads=3
    )
    assert len(batch) == 3
    assert all(s.error() is None and isinstance(s["answer"], str) for s in batch)


def test_example_run_all_completes(acme: sgl.RuntimeEndpoint, frontend: ModuleType) -> None:
    out = frontend.run_all(acme, document=long_prompt())
    assert out["roles"] == ["system", "user", "assistant"]
    assert out["label"] in ("billing", "shipping", "other")
    assert len(out["batch"]) == 2 and len(out["fork_answers"]) == 2
    assert isinstance(out["summary"], str)


def test_fork_reuses_the_document_within_the_tenant_only(
    server: ServerProcess, keys: dict[str, str], acme: sgl.RuntimeEndpoint, frontend: ModuleType
) -> None:
    document = long_prompt()
    state = frontend.review.run(document=document, questions=["first?", "second?"], backend=acme)
    assert state.error() is None
    for meta in state.ret_value:
        # Positive control: each branch reuses the shared document the fork sent ahead.
        assert meta["cached_tokens"] > meta["prompt_tokens"] // 2 > 0, meta
    shared = "Document: " + document + "\n"
    assert generate(server, keys["globex"], shared)["cached_tokens"] == 0  # isolation
    again = generate(server, keys["acme"], shared)
    assert again["cached_tokens"] >= again["prompt_tokens"] - 1  # positive control, same request shape

    status, tenants = server.get_with("/iso/tenants", auth(keys["admin"]))
    assert status == 200, tenants
    assert tenants["tenants"]["acme"]["ranks"][0]["lookup_hit_tokens"] > 0


def test_admin_only_frontend_calls_fail_cleanly(
    server: ServerProcess, keys: dict[str, str], acme: sgl.RuntimeEndpoint
) -> None:
    with pytest.raises(RuntimeError, match="admin_required"):
        acme.flush_cache()
    with pytest.raises(RuntimeError, match="admin_required"):
        acme.get_server_info()
    with pytest.raises(RuntimeError, match="admin_required"):
        acme.start_profile()

    @sgl.function
    def spliced(s, text):
        s += text
        s.sync()
        branches = s.fork(2)
        for i, branch in enumerate(branches):
            branch += f" part {i}: " + sgl.gen("part", max_tokens=1)
        branches.join("concate_and_append")

    # NOTE: use_thread=False raises in the caller; in the default threaded executor the error lands in
    # state.error() and a later read of a variable queued after it blocks (upstream SGLang behaviour).
    with pytest.raises(RuntimeError, match="admin_required"):
        spliced.run(text="splice these", backend=acme, use_thread=False)
    for path in ("/flush_cache", "/concate_and_append_request", "/server_info"):
        status, out = server.post(path, {}, headers=auth(keys["acme"]))
        assert status == 403 and out["error"]["code"] == "admin_required", (path, status, out)


def test_frontend_example_script_runs(server: ServerProcess, keys: dict[str, str]) -> None:
    env = {**os.environ, "SGLANG_ISO_URL": server.base_url, "SGLANG_ISO_API_KEY": keys["acme"]}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "frontend_tenant.py")], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "select:" in out.stdout and "from the cache" in out.stdout


def test_unmodified_sglang_program_in_a_fresh_interpreter(server: ServerProcess, keys: dict[str, str]) -> None:
    """``import sglang`` first, no sglang-iso import: the environment's start hook applies the CPU shims."""

    nonce = secrets.token_hex(8)

    def run(tenant: str) -> list[dict[str, int]]:
        out = subprocess.run(
            [sys.executable, str(PROGRAMS / "multi_turn.py"), server.base_url, keys[tenant], nonce],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    acme = run("acme")
    globex = run("globex")
    assert len(acme) == 2 and len(globex) == 2, f"{acme=} {globex=}"
    # Positive control: acme's second run reuses its first run's prompt (the nonce and everything after it).
    assert acme[1]["answer_1"] > 8, f"{acme=}"
    # globex's first run sends the same prompt: at most its own chat-template head (BOS and the system role
    # markers, before the nonce), nothing of acme's.
    assert globex[0]["answer_1"] <= 8, f"{globex=}"
    assert acme[1]["answer_1"] > globex[0]["answer_1"] + 16, f"{acme=} {globex=}"


# --- OpenAI Python SDK --------------------------------------------------------------------------------


def test_openai_sdk_with_a_tenant_key(server: ServerProcess, keys: dict[str, str], oai: ModuleType) -> None:
    client = oai.client(server.base_url, keys["acme"])
    text, _ = oai.chat(client, "Hello")
    assert isinstance(text, str)
    parts, finish_reason = oai.stream_chat(client, "Hello again", max_tokens=6)
    assert parts and finish_reason in ("length", "stop")
    assert isinstance(oai.complete(client, "Once upon a time"), str)


def test_openai_chat_cache_isolation(server: ServerProcess, keys: dict[str, str], oai: ModuleType) -> None:
    question = long_prompt()

    def cached(key: str) -> tuple[int, int]:
        r = oai.client(server.base_url, keys[key]).chat.completions.create(
            model="default", messages=[{"role": "user", "content": question}], max_tokens=1
        )
        return r.usage.prompt_tokens_details.cached_tokens or 0, r.usage.prompt_tokens

    cached("acme")
    hit, prompt_tokens = cached("acme")
    assert hit >= prompt_tokens - 1  # positive control
    # Isolation: globex may reuse at most its own template head (BOS, <|user|>), never acme's question.
    assert cached("globex")[0] <= 2
    status, tenants = server.get_with("/iso/tenants", auth(keys["admin"]))
    assert status == 200 and tenants["tenants"]["acme"]["ranks"][0]["violations"] == 0


def test_openai_wrong_key_is_authentication_error(server: ServerProcess, keys: dict[str, str], oai: ModuleType) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        oai.chat(oai.client(server.base_url, "sk-iso-not-a-real-key"), "hi")
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError) as denied:
        oai.chat(oai.client(server.base_url, keys["admin"]), "hi")
    assert denied.value.status_code == 403 and denied.value.code == "tenant_key_required"


def test_openai_example_script_runs(server: ServerProcess, keys: dict[str, str]) -> None:
    env = {**os.environ, "SGLANG_ISO_URL": server.base_url, "SGLANG_ISO_API_KEY": keys["globex"]}
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "openai_tenant.py")], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "chat (repeated)" in out.stdout and "completion:" in out.stdout
