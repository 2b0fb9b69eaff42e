"""The real SGLang server, started by sglang-iso's launcher, serves every API with the tenant cache."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

from sglang_iso_testing.process import ServerProcess

pytestmark = pytest.mark.e2e


def _unique_prompt(words: int = 40) -> str:
    nonce = uuid.uuid4().hex
    return f"Ticket {nonce}: " + " ".join(f"item{i} of the order {nonce[:6]}" for i in range(words // 4))


def _generate(server: ServerProcess, text: str, **extra: object) -> dict:
    status, out = server.post(
        "/generate", {"text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0}, **extra}
    )
    assert status == 200, out
    return out


def test_tenant_backend_is_the_live_tree_cache(iso_server: ServerProcess) -> None:
    status, info = iso_server.get("/get_server_info")
    assert status == 200
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    assert tree["is_tenant"] is True
    assert tree["impl"] == "TenantRadixCache"
    log = iso_server.log_text()
    assert "Tree cache initialized: source=registered('tenant') impl=TenantRadixCache" in log
    assert "sglang-iso: verified live tree cache" in log


def test_generate_repeated_prompt_hits_cache(iso_server: ServerProcess) -> None:
    prompt = _unique_prompt()
    first = _generate(iso_server, prompt)["meta_info"]
    second = _generate(iso_server, prompt)["meta_info"]
    other = _generate(iso_server, _unique_prompt())["meta_info"]
    assert first["cached_tokens"] == 0
    assert second["prompt_tokens"] == first["prompt_tokens"]
    # Everything but the last prompt token is reused (the last one is always recomputed).
    assert second["cached_tokens"] >= first["prompt_tokens"] - 1 > 0
    # Control: an unrelated prompt shares at most the short common template prefix.
    assert other["cached_tokens"] < second["cached_tokens"] // 2


def test_generate_tokens_and_batch(iso_server: ServerProcess) -> None:
    status, out = iso_server.post(
        "/generate", {"text": ["alpha beta", "gamma delta"], "sampling_params": {"max_new_tokens": 3}}
    )
    assert status == 200
    assert len(out) == 2 and all(o["meta_info"]["completion_tokens"] == 3 for o in out)


def test_completions(iso_server: ServerProcess) -> None:
    status, out = iso_server.post(
        "/v1/completions", {"model": "default", "prompt": _unique_prompt(), "max_tokens": 5, "temperature": 0}
    )
    assert status == 200, out
    assert out["object"] == "text_completion"
    assert out["usage"]["completion_tokens"] == 5
    assert isinstance(out["choices"][0]["text"], str)


def _stream(server: ServerProcess, path: str, payload: dict) -> list[dict]:
    req = urllib.request.Request(
        server.base_url + path, data=json.dumps({**payload, "stream": True}).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    chunks: list[dict] = []
    done = False
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        assert r.headers.get_content_type() == "text/event-stream"
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            chunks.append(json.loads(data))
    assert done, "stream did not end with [DONE]"
    return chunks


def test_completions_streaming(iso_server: ServerProcess) -> None:
    chunks = _stream(iso_server, "/v1/completions", {"model": "default", "prompt": "Once upon", "max_tokens": 6})
    texts = [c["choices"][0]["text"] for c in chunks if c.get("choices")]
    assert len(texts) >= 2
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
    assert finish[-1] == "length"


def test_chat_completions(iso_server: ServerProcess) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": _unique_prompt(12)}]
    body = {"model": "default", "messages": messages, "max_tokens": 5, "temperature": 0}
    status, first = iso_server.post("/v1/chat/completions", body)
    assert status == 200, first
    assert first["choices"][0]["message"]["role"] == "assistant"
    assert first["usage"]["completion_tokens"] == 5
    # The same conversation again reuses the rendered prompt (seen through /generate's twin request).
    status, again = iso_server.post("/v1/chat/completions", body)
    assert status == 200
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]


def test_chat_completions_streaming(iso_server: ServerProcess) -> None:
    chunks = _stream(
        iso_server,
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 6},
    )
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    assert any(d.get("content") for d in deltas)
    assert chunks[-1]["choices"][0].get("finish_reason") in ("length", "stop") or any(
        c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")
    )


def test_malformed_request_is_a_clear_4xx(iso_server: ServerProcess) -> None:
    status, out = iso_server.post("/v1/chat/completions", {"model": "default", "messages": "not a list"})
    assert 400 <= status < 500, out
    # The server keeps serving after it.
    assert _generate(iso_server, "still alive")["meta_info"]["completion_tokens"] == 4


def test_freed_pages_are_scrubbed_in_the_server(iso_server: ServerProcess) -> None:
    for _ in range(3):
        _generate(iso_server, _unique_prompt())
    status, info = iso_server.get("/get_server_info")
    assert status == 200
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    assert tree["kv_scrub"] == "on-free"
    # Every finished request frees at least its last slot; each hand-out scrubs them first.
    assert tree["scrubbed_pages"] > 0 and tree["scrub_calls"] > 0
    assert tree["reset_rows"] > 0


@pytest.mark.parametrize("input_ids", [[5, 1 << 20], [-1]], ids=["out-of-vocabulary", "negative"])
def test_unrunnable_token_ids_are_aborted_alone_without_the_gate(
    iso_server: ServerProcess, input_ids: list[int]
) -> None:
    # No tenants file here, so no gate: the scheduler's own guard must stop what would crash the forward.
    status, out = iso_server.post("/generate", {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 2}})
    assert status == 400 and "vocabulary" in json.dumps(out), out
    assert iso_server.proc is not None and iso_server.proc.poll() is None
    # Positive control: the same request with in-vocabulary ids is served by the same scheduler.
    status, out = iso_server.post("/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and len(out["output_ids"]) == 2, out
