"""The request plane end to end: no tenant can crash the server, touch another tenant's requests, get past the
gate or starve the others. Each attack fails, and the same operation on the tenant's own request still works;
after every attack both tenants are still served, with a same-tenant cache hit (positive control) and no
cross-tenant hit.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess

from .conftest import start_iso_server
from .helpers import assert_alive_and_isolated, call, gen_body, write_alpha_beta

pytestmark = pytest.mark.e2e

VOCAB = json.loads((Path(tiny_model_path()) / "config.json").read_text())["vocab_size"]
BETA_LIMIT = 3  # beta's max_concurrent_requests


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in ("alpha", "beta", "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    path = write_alpha_beta(tmp_path_factory.mktemp("tenants"), keys, beta_limit=BETA_LIMIT)
    srv = start_iso_server("--tenants-file", str(path), "--enable-cache-report", "--enable-metrics")
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


class Stream:
    """A streaming /generate in a background thread; ``finish_reason`` once it ends."""

    def __init__(self, server: ServerProcess, key: str, rid: str, max_new_tokens: int = 1000) -> None:
        self.status: int | None = None
        self.finish: Any = None
        self.error: Any = None
        self.started = threading.Event()
        body = gen_body(f"{uuid.uuid4().hex} stream", max_new_tokens, rid=rid, stream=True)
        body["sampling_params"]["ignore_eos"] = True
        self._thread = threading.Thread(target=self._run, args=(server, key, body), daemon=True)
        self._thread.start()

    def _run(self, server: ServerProcess, key: str, body: dict[str, Any]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        conn.request("POST", "/generate", json.dumps(body), headers)
        resp = conn.getresponse()
        self.status = resp.status
        if resp.status != 200:
            self.error = resp.read().decode(errors="replace")
        for line in resp:
            self.started.set()
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: ") :])
            if "error" in chunk:
                self.error = chunk["error"]
            reason = chunk.get("meta_info", {}).get("finish_reason")
            if reason is not None:
                self.finish = reason
        self.started.set()
        conn.close()

    def wait(self, timeout_s: float = 300.0) -> Any:
        self._thread.join(timeout_s)
        return self.finish


CRASHERS: list[tuple[str, dict[str, Any], str]] = [
    ("/generate", {"input_ids": [5, VOCAB], "sampling_params": {"max_new_tokens": 2}}, "input_ids"),
    ("/generate", {"input_ids": [-1], "sampling_params": {"max_new_tokens": 2}}, "input_ids"),
    ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": VOCAB + 1}, "top_logprobs_num"),
    ("/generate", {"text": "x", "return_logprob": True, "logprob_start_len": -5}, "logprob_start_len"),
    ("/generate", {"text": "x", "custom_labels": {"foo": "bar"}}, "custom_labels"),
    (
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 5000},
        "top_logprobs",
    ),
    ("/v1/completions", {"model": "default", "prompt": "hi", "logprobs": 5000, "max_tokens": 2}, "logprobs"),
    ("/v1/completions", {"model": "default", "prompt": [1, 2, VOCAB + 7], "max_tokens": 2}, "prompt"),
    ("/detokenize", {"tokens": [VOCAB + 5]}, "tokens"),
]


@pytest.mark.parametrize(("path", "body", "field"), CRASHERS, ids=[f"{c[0]}:{c[2]}" for c in CRASHERS])
def test_crashers_get_400_naming_the_field(
    server: ServerProcess, keys: dict[str, str], path: str, body: dict[str, Any], field: str
) -> None:
    status, out, _ = call(server, "POST", path, body, keys["beta"])
    assert status == 400 and out["error"]["param"] == field, out
    assert server.proc is not None and server.proc.poll() is None


def test_in_range_versions_of_the_crashers_are_served(server: ServerProcess, keys: dict[str, str]) -> None:
    body: dict[str, Any] = {"input_ids": [5, VOCAB - 1], "sampling_params": {"max_new_tokens": 2}}
    status, out, _ = call(server, "POST", "/generate", body, keys["beta"])
    assert status == 200, out
    body = gen_body("hello", return_logprob=True, top_logprobs_num=3)
    status, out, _ = call(server, "POST", "/generate", body, keys["beta"])
    assert status == 200 and len(out["meta_info"]["output_top_logprobs"][0]) == 3, out
    status, out, _ = call(server, "POST", "/detokenize", {"tokens": [5, 6]}, keys["beta"])
    assert status == 200, out
    assert_alive_and_isolated(server, keys)


@pytest.mark.parametrize(
    ("raw", "why"),
    [(b"[" * 990 + b"]" * 990, "deep"), (b'[{"role": "user", "content": "hi"}]', "list"), (b"{not json", "syntax")],
)
def test_malformed_json_is_400_never_500(server: ServerProcess, keys: dict[str, str], raw: bytes, why: str) -> None:
    status, out, _ = call(server, "POST", "/v1/chat/completions", key=keys["beta"], raw=raw)
    assert status == 400 and out["error"]["code"] == "invalid_json", (why, out)


def test_put_is_checked_like_post(server: ServerProcess, keys: dict[str, str]) -> None:
    for field in ("extra_key", "mm_hashes", "data_parallel_rank", "bootstrap_room"):
        status, out, _ = call(server, "PUT", "/generate", gen_body("x", **{field: 1}), keys["beta"])
        assert status == 400 and out["error"]["param"] == field, out
    # The rid is moved into beta's id space on PUT too; beta's own PUT works.
    status, out, _ = call(server, "PUT", "/generate", gen_body("x", rid="alpha.victim"), keys["beta"])
    assert status == 200 and out["meta_info"]["id"] == "beta.alpha.victim", out


def test_request_ids_are_per_tenant(server: ServerProcess, keys: dict[str, str]) -> None:
    victim = Stream(server, keys["alpha"], "job1")
    assert victim.started.wait(120)
    # beta squats alpha's id, bare and fully qualified: no duplicate error, nothing about alpha is echoed.
    for rid in ("job1", "alpha.job1"):
        status, out, _ = call(server, "POST", "/generate", gen_body("x", rid=rid), keys["beta"])
        assert status == 200 and out["meta_info"]["id"] == f"beta.{rid}", out
    # Positive control: alpha's own duplicate is detected, in alpha's id space.
    status, out, _ = call(server, "POST", "/generate", gen_body("x", rid="job1"), keys["alpha"])
    assert status == 400 and "alpha.job1" in json.dumps(out), (out, victim.status, victim.finish, victim.error)
    assert victim.wait()["type"] == "length", victim.finish  # alpha's request was never aborted
    # After completion alpha reuses its own id.
    status, out, _ = call(server, "POST", "/generate", gen_body("x", rid="job1"), keys["alpha"])
    assert status == 200, out


def test_a_dropped_connection_aborts_only_the_callers_requests(server: ServerProcess, keys: dict[str, str]) -> None:
    victim = Stream(server, keys["alpha"], "long1")
    assert victim.started.wait(120)
    # beta names alpha's id prefix on /generate and /v1/responses, then drops the connection mid-request.
    for path, body in (
        ("/generate", {**gen_body("y", 200, rid="alpha", stream=True)}),
        ("/v1/responses", {"model": "default", "input": "hi", "request_id": "alpha", "stream": True}),
    ):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        payload = json.dumps(body).encode()
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {keys['beta']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        sock.recv(64)
        sock.close()
    assert victim.wait()["type"] == "length", victim.finish  # alpha's request ran to its end
    # Positive control: alpha dropping its own stream ends its own request; its id is free again at once.
    own = Stream(server, keys["alpha"], "long2")
    assert own.started.wait(120)
    status, out, _ = call(server, "POST", "/generate", gen_body("x", rid="long2"), keys["alpha"])
    assert status == 400, out  # still running: a duplicate
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    body = json.dumps(gen_body("z", 1000, rid="long3", stream=True)).encode()
    sock.sendall(
        f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {keys['alpha']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    sock.recv(64)
    sock.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, out, _ = call(server, "POST", "/generate", gen_body("x", rid="long3"), keys["alpha"])
        if status == 200:
            break
        time.sleep(0.5)
    assert status == 200, out
    own.wait()
    assert_alive_and_isolated(server, keys)


def test_a_flooding_tenant_gets_429_and_the_other_is_served(server: ServerProcess, keys: dict[str, str]) -> None:
    def beta_stream(i: int) -> tuple[int, str | None]:
        body = gen_body(f"{uuid.uuid4().hex} flood {i}", 300, stream=True)
        body["sampling_params"]["ignore_eos"] = True
        status, _, headers = call(server, "POST", "/generate", body, keys["beta"], timeout_s=300)
        return status, headers.get("retry-after")

    with ThreadPoolExecutor(max_workers=4 * BETA_LIMIT) as pool:
        flood = [pool.submit(beta_stream, i) for i in range(4 * BETA_LIMIT)]
        time.sleep(2)
        status, out, _ = call(server, "POST", "/generate", gen_body("alpha's short request", 8), keys["alpha"])
        assert status == 200, out
        results = [f.result(timeout=600) for f in flood]
    refused = [r for r in results if r[0] == 429]
    assert refused and all(r[1] == "1" for r in refused), results
    assert sum(1 for r in results if r[0] == 200) >= BETA_LIMIT, results
    assert all(r[0] in (200, 429) for r in results), results
    # A slot is given back when SGLang's handler returns, just after the last byte: beta is served again soon.
    deadline = time.monotonic() + 60
    while call(server, "POST", "/generate", gen_body("x"), keys["beta"])[0] == 429 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert_alive_and_isolated(server, keys)


def test_slow_and_idle_connections_starve_no_one(server: ServerProcess, keys: dict[str, str]) -> None:
    """Slowloris and its relatives from one tenant: hundreds of connections that never finish their headers,
    authenticated requests whose bodies trickle, idle connections. While they are open both tenants are served
    (with a same-tenant hit), and the attacker's own complete requests too; a trickled body, once finished, is
    answered (the slow path works, it is only slow). The body timeout and the per-tenant cap on bodies arriving at
    once are pinned by the gate's unit test."""
    body = json.dumps(gen_body(f"{uuid.uuid4().hex} trickled body", 4)).encode()
    head = (
        f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {keys['beta']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    opened: list[socket.socket] = []
    trickled: list[socket.socket] = []
    idle_s, rss_before = alpha_latencies(server, keys), rss_kib(server)
    try:
        for _ in range(300):  # headers never finished
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ")
            opened.append(sock)
        for _ in range(4 * BETA_LIMIT):  # bodies trickled: one byte of many, more connections than beta's limit
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=120)
            sock.sendall(head + body[:1])
            trickled.append(sock)
        opened += [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(100)]  # idle
        sock = trickled.pop()  # NOTE: finished well within the gate's body timeout
        sock.sendall(body[1:])
        reply = sock.recv(65536).split(b"\r\n", 1)[0]
        assert reply.startswith(b"HTTP/1.1 200"), reply
        sock.close()
        assert_alive_and_isolated(server, keys)
        status, out, _ = call(server, "POST", "/generate", gen_body(f"{uuid.uuid4().hex} beta's own", 4), keys["beta"])
        assert status == 200, out  # slow connections hold none of beta's admission slots
        attacked_s, rss_during = alpha_latencies(server, keys), rss_kib(server)
    finally:
        for sock in opened + trickled:
            sock.close()
    assert_alive_and_isolated(server, keys)
    # NOTE: reported, never asserted (timings on this machine are noise): alpha's tail under the attack vs idle,
    # and the HTTP process's memory.
    print(
        f"alpha P99 idle {max(idle_s) * 1e3:.0f} ms, under attack {max(attacked_s) * 1e3:.0f} ms "
        f"({max(attacked_s) / max(idle_s):.2f}x); HTTP process RSS {rss_before} KiB before, {rss_during} KiB during, "
        f"{rss_kib(server)} KiB after"
    )


def alpha_latencies(server: ServerProcess, keys: dict[str, str], n: int = 20) -> list[float]:
    """Seconds each of ``n`` sequential short requests of alpha took (the worst of 20 is their P95-P99)."""
    took = []
    for _ in range(n):
        start = time.monotonic()
        status, out, _ = call(server, "POST", "/generate", gen_body(f"{uuid.uuid4().hex} alpha", 2), keys["alpha"])
        assert status == 200, out
        took.append(time.monotonic() - start)
    return took


def rss_kib(server: ServerProcess) -> int:
    """Resident memory of the HTTP process (the launcher's process serves HTTP), KiB."""
    assert server.proc is not None
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def test_encoded_bodies_and_websockets_are_refused(server: ServerProcess, keys: dict[str, str]) -> None:
    compressed = {"x-body-compressed": "zstd"}
    status, out, _ = call(
        server, "POST", "/generate", gen_body("x", extra_key="alpha"), keys["beta"], headers=compressed
    )
    assert status == 400 and out["error"]["param"] == "x-body-compressed", out
    status, out, _ = call(
        server, "POST", "/generate", gen_body("x"), keys["beta"], headers={"Content-Encoding": "zstd"}
    )
    assert status == 415, out
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(
        b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + f"Authorization: Bearer {keys['beta']}\r\n\r\n".encode()
    )
    reply = sock.recv(256)
    sock.close()
    assert not reply.startswith(b"HTTP/1.1 101"), reply


def test_metrics_need_the_admin_key(server: ServerProcess, keys: dict[str, str]) -> None:
    assert call(server, "GET", "/metrics")[0] == 401
    assert call(server, "GET", "/metrics", key=keys["beta"])[0] == 403
    status, body, _ = call(server, "GET", "/metrics", key=keys["admin"])
    assert status == 200 and "sglang" in body
    assert call(server, "GET", "/health")[0] == 200  # probes stay open
