"""Helpers shared by the e2e modules: the tenants files they serve, prompts, and HTTP calls with a tenant's key.

(Test modules import from here and from ``conftest``, never from each other.)
"""

from __future__ import annotations

import http.client
import json
import random
import string
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from sglang_iso_testing.plant import plant_env
from sglang_iso_testing.process import ServerProcess
from sglang_iso_testing.tenants import write_tenants_file as write_tenants

from .conftest import start_iso_server

TENANTS = ("acme", "globex", "initech", "hooli", "hooli-eu")
SHARED_SYSTEM_PROMPT = " ".join(f"Rule {i}: answer politely and never reveal internal notes." for i in range(8))


def write_tenants_file(directory: Path, keys: Mapping[str, str | Sequence[str]]) -> Path:
    """The five tenants (two private, one with cache off, a group of two), a shared prefix for acme and globex."""
    cache = {"acme": "private", "globex": "private", "initech": "off", "hooli": "group:hooli"}
    cache["hooli-eu"] = "group:hooli"
    support_bot = {
        "name": "support-bot",
        "messages": [{"role": "system", "content": SHARED_SYSTEM_PROMPT}],
        "tenants": ["acme", "globex"],
    }
    tenants = {name: {"cache": cache[name]} for name in TENANTS}
    return write_tenants(directory, tenants, keys=keys, shared_prefixes=[support_bot]).path


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# NOTE: each prompt starts with its own single-letter word, because the byte-level
# pre-tokenizer splits at the space: no two prompts of this module share even
# their first token, so a cross-tenant "cached_tokens == 0" is exact, not approximate.
_FIRST_WORDS = iter(string.ascii_letters)


def long_prompt() -> str:
    nonce = uuid.uuid4().hex
    return f"{next(_FIRST_WORDS)} memo {nonce}: " + " ".join(f"clause {i} of contract {nonce[:8]}" for i in range(12))


def generate(server: ServerProcess, key: str, text: str, **extra: object) -> dict:
    status, out = server.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, **extra},
        headers=auth(key),
    )
    assert status == 200, out
    return out["meta_info"]


TWO_TENANTS = ("acme", "globex")


def write_two_tenants_file(directory: Path, keys: dict[str, str]) -> Path:
    """A tenants file with ``acme`` and ``globex`` (both ``private``) and the admin key; returns its path.

    ``keys`` maps "acme", "globex" and "admin" to API keys. Servers given the same file share the secret,
    so they derive the same namespace ids (the router tests rely on this).
    """
    return write_tenants(directory, {name: {"cache": "private"} for name in TWO_TENANTS}, keys=keys).path


def write_alpha_beta(directory: Path, keys: dict[str, str], *, beta_limit: int | None = None) -> Path:
    """Tenants ``alpha`` and ``beta`` (optionally with beta's in-flight limit) and the admin key; returns the path."""
    beta = {} if beta_limit is None else {"max_concurrent_requests": beta_limit}
    return write_tenants(directory, {"alpha": {}, "beta": beta}, keys=keys).path


def call(
    server: ServerProcess,
    method: str,
    path: str,
    body: Any = None,
    key: str | None = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> tuple[int, Any, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout_s)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        hdrs["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        try:
            decoded: Any = json.loads(payload)
        except ValueError:
            decoded = payload.decode(errors="replace")
        return resp.status, decoded, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def gen_body(text: str, max_new_tokens: int = 2, **extra: Any) -> dict[str, Any]:
    return {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}, **extra}


# NOTE: every other prompt of these modules starts lowercase; an uppercase single-letter first word (split off by
# the byte-level pre-tokenizer) makes a cross-tenant "cached_tokens == 0" exact, not approximate.
_UPPER_FIRST_WORDS = iter(string.ascii_uppercase)


def assert_alive_and_isolated(server: ServerProcess, keys: dict[str, str]) -> None:
    """Both tenants served; same-tenant hit (positive control), cross-tenant miss."""
    text = f"{next(_UPPER_FIRST_WORDS)} {uuid.uuid4().hex} " + " ".join(f"clause {i}" for i in range(20))
    metas = []
    for tenant in ("alpha", "alpha", "beta"):
        status, out, _ = call(server, "POST", "/generate", gen_body(text), keys[tenant])
        assert status == 200, out
        metas.append(out["meta_info"])
    assert metas[1]["cached_tokens"] > metas[1]["prompt_tokens"] // 2, metas
    assert metas[2]["cached_tokens"] == 0, metas


NEW_TOKENS = 16


TIE_LOGPROB = 1e-2  # two tokens this close in logprob are a float tie, not a choice


def spec_server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str], *flags: str) -> Iterator[ServerProcess]:
    """A tenant-keyed server with Triton attention in its interpreter, the test plugin, and speculative ``flags``."""
    path: Path = write_tenants_file(tmp_path_factory.mktemp("tenants"), keys)
    srv = start_iso_server(
        "--tenants-file", str(path), "--attention-backend", "triton", "--dtype", "float32", *flags, "--enable-metrics",
        # NOTE: the Triton backend needs the interpreter on CPU; the plant switch arms only on an admin command.
        # float32, not the float16 SGLang picks for a float32 checkpoint: a verify pass over 8 drafts and one prefill
        # per token differ by up to 0.1 in log-probability in half precision, far above a tie
        env={"TRITON_INTERPRET": "1", **plant_env()},
    )  # fmt: skip
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


# NOTE: a distinct first token per prompt in the run, because two prompts agreeing on their first token share a
# one-token prefix: a tenant's own earlier prompt would then be a legitimate hit where a test expects none.
_FIRST_IDS = iter(random.Random(uuid.uuid4().int).sample(range(300, 2000), 1700))


def random_prompt(length: int = 24) -> list[int]:
    rng = random.Random(uuid.uuid4().int)
    return [next(_FIRST_IDS), *(rng.randrange(300, 2000) for _ in range(length - 1))]


def generate_ids(server: ServerProcess, key: str, ids: list[int], new_tokens: int = NEW_TOKENS) -> dict:
    status, out = server.post(
        "/generate",
        {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}},
        headers=auth(key),
    )
    assert status == 200, out
    return out


def greedy_one_by_one(
    server: ServerProcess, key: str, ids: list[int], new_tokens: int = NEW_TOKENS
) -> tuple[list[int], list[float]]:
    """The greedy continuation one prefill at a time, with the logprob gap between the top two tokens of each step."""
    out: list[int] = []
    gaps: list[float] = []
    for _ in range(new_tokens):
        status, got = server.post(
            "/generate",
            {"input_ids": ids + out, "return_logprob": True, "top_logprobs_num": 2,
             "sampling_params": {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}},
            headers=auth(key),
        )  # fmt: skip
        assert status == 200, got
        assert "spec_verify_ct" not in got["meta_info"] or got["meta_info"]["spec_verify_ct"] == 0
        top = got["meta_info"]["output_top_logprobs"][0]
        gaps.append(top[0][0] - top[1][0])
        out += got["output_ids"]
    return out, gaps


def assert_greedy_equal(output: list[int], reference: list[int], gaps: list[float]) -> None:
    """``output`` equals the reference; it may part from it only where the reference's top two tokens tie.

    Two computations of the same context (a speculative verify pass against one token per prefill, a reused state
    snapshot against a recomputation) differ in the last bits of their float sums, so a tie between two tokens can
    break either way. Anything else is a real difference.
    """
    assert len(output) == len(reference)
    for i, (got, want) in enumerate(zip(output, reference, strict=True)):
        if got != want:
            assert gaps[i] < TIE_LOGPROB, (i, output, reference, gaps)
            return


# ----------------------------------------------------------------------------------------- PD: router and workers


CLIENT_TIMEOUT_S = 90.0
"""How long a client waits for the PD router's answer."""


def router_generate(router: ServerProcess, key: str, text: str, **extra: Any) -> tuple[int, Any]:
    """``/generate`` through a router (8 greedy tokens); (status, body)."""
    return router.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, **extra},
        headers=auth(key),
        timeout_s=CLIENT_TIMEOUT_S,
    )


def router_ok(router: ServerProcess, key: str, text: str, **extra: Any) -> dict[str, Any]:
    """:func:`router_generate` that must answer 200."""
    status, out = router_generate(router, key, text, **extra)
    assert status == 200, out
    return dict(out)


def until(check: Any, what: str, timeout_s: float = 60.0) -> None:
    """Poll ``check()`` every 0.3 s until it is true; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise TimeoutError(f"waited {timeout_s:.0f}s for {what}")


def pd_state(server: ServerProcess, admin_key: str) -> dict[str, Any]:
    """A PD worker's transfer guard (``GET /iso/pd``, first scheduler)."""
    status, out = server.get_with("/iso/pd", auth(admin_key))
    assert status == 200, out
    return dict(out["pd"][0])


def router_workers(router: ServerProcess, admin_key: str) -> list[dict[str, Any]]:
    """The router's workers (``GET /workers``); empty when it does not answer."""
    status, out = router.get_with("/workers", auth(admin_key))
    return list(out.get("workers", [])) if status == 200 and isinstance(out, dict) else []


def wait_for_router_workers(router: ServerProcess, admin_key: str, n: int, timeout_s: float = 120.0) -> None:
    """Until the router reports ``n`` healthy workers."""
    until(
        lambda: sum(1 for w in router_workers(router, admin_key) if w.get("is_healthy")) >= n,
        f"{n} healthy router workers",
        timeout_s,
    )


def post_ids(server: ServerProcess, key: str, ids: list[int], new_tokens: int, **extra: object) -> tuple[int, Any]:
    """A greedy ``/generate`` of ``new_tokens`` tokens (EOS ignored) for ``ids``: status and body, unchecked."""
    sampling = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    return server.post("/generate", {"input_ids": ids, "sampling_params": sampling, **extra}, headers=auth(key),
                       timeout_s=300)  # fmt: skip


def generate_to_length(server: ServerProcess, key: str, ids: list[int], new_tokens: int) -> dict:
    """:func:`post_ids`, which must be served in full (status 200, finished by length)."""
    status, out = post_ids(server, key, ids, new_tokens)
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "length", (status, out)
    return out


def server_info(server: ServerProcess, admin_key: str) -> dict:
    """``/get_server_info`` read with the admin key."""
    status, info = server.get_with("/get_server_info", auth(admin_key))
    assert status == 200, info
    return info


def tree_state(server: ServerProcess, admin_key: str) -> dict:
    """The tenant tree cache's status of the first scheduler."""
    return server_info(server, admin_key)["internal_states"][0]["sglang_iso"]["tree_cache"]


def internal_command(server: ServerProcess, admin_key: str, command: str) -> bool:
    """Send one ``/set_internal_state`` command (ours or a test plugin's); True when every rank confirmed it."""
    status, out = server.post("/set_internal_state", {"server_args": {command: 1}}, headers=auth(admin_key))
    assert status == 200, out
    return out == [True]


def assert_free_pages_zero(server: ServerProcess, admin_key: str) -> None:
    """Every free device page is zero (the test plugin's check, run after its self-test: it dirties a free page and
    must find it). The server runs with :func:`plant_env`."""
    from sglang_iso_testing.spec_plant import FREE_PAGES_ZERO

    for command in (FREE_PAGES_ZERO + ":selftest", FREE_PAGES_ZERO):
        assert internal_command(server, admin_key, command), command


def assert_planted_slot_aborts(
    server: ServerProcess, keys: Mapping[str, str], prompt_len: int, new_tokens: int
) -> None:
    """globex fills pages; a foreign slot planted into acme's next row is redirected and acme's request aborted,
    counted as a violation; acme's next request is served normally (control). The server runs with
    :func:`plant_env`."""
    from sglang_iso_testing.plant import COMMAND as PLANT

    generate_to_length(server, keys["globex"], random_prompt(prompt_len), new_tokens)  # globex owns pages
    before = tree_state(server, keys["admin"])["owner_violations"]
    assert internal_command(server, keys["admin"], PLANT + "acme")
    status, out = post_ids(server, keys["acme"], random_prompt(12), new_tokens)
    aborted = status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
    assert aborted or 400 <= status < 500, (status, out)
    assert "isolation violation" in str(out)
    assert tree_state(server, keys["admin"])["owner_violations"] > before
    generate_to_length(server, keys["acme"], random_prompt(12), new_tokens)  # served normally afterwards


def assert_free_pages_zero_after_pressure(
    server: ServerProcess, keys: Mapping[str, str], pool_tokens: int, new_tokens: int
) -> None:
    """1.2 pools' worth of prompts across two tenants (the tree evicts and scrubs), then every free page is zero
    (the check's self-test first: a dirtied free page is found)."""
    from sglang_iso_testing.spec_plant import FREE_PAGES_ZERO

    admin = keys["admin"]
    assert internal_command(server, admin, FREE_PAGES_ZERO + ":selftest")
    for i in range(6):
        tenant = keys["acme" if i % 2 else "globex"]
        generate_to_length(server, tenant, random_prompt(pool_tokens // 5), new_tokens)
    assert tree_state(server, admin)["scrubbed_pages"] > 0
    assert internal_command(server, admin, FREE_PAGES_ZERO)


def audit_events(path: Path, event: str) -> list[dict[str, Any]]:
    """The audit log's ``event`` records, oldest first."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in (json.loads(line) for line in lines if line.strip()) if e.get("event") == event]


def conversation_trace(seed: int, steps: int) -> list[tuple[str, list[int]]]:
    """A random multi-tenant conversation trace: (tenant, prompt ids) per request. Each step starts a conversation,
    continues one of the tenant's own (its last prompt, the reply placeholder filled in at run time, new tokens),
    re-sends the tenant's last prompt, or sends another tenant's last prompt as its own."""
    rng = random.Random(seed)
    tenants = ("acme", "globex")
    last: dict[str, list[int]] = {}
    out: list[tuple[str, list[int]]] = []
    for _ in range(steps):
        tenant = rng.choice(tenants)
        other = next(t for t in tenants if t != tenant)
        action = rng.choice(("new", "continue", "continue", "resend", "foreign")) if tenant in last else "new"
        if action == "new":
            prompt = random_prompt(rng.randrange(20, 48))
        elif action == "continue":
            prompt = [*last[tenant], REPLY, *(rng.randrange(300, 2000) for _ in range(rng.randrange(4, 12)))]
        elif action == "resend" or other not in last:
            prompt = list(last[tenant])
        else:
            prompt = list(last[other])
        last[tenant] = prompt
        out.append((tenant, prompt))
    return out


REPLY = -1
"""Placeholder in a traced prompt for the reply to the prompt before it (the server's own output)."""


def run_trace(trace: list[tuple[str, list[int]]], send: Callable[[str, list[int]], dict]) -> list[tuple[int, list]]:
    """(cached tokens, output ids) of each request, with each placeholder replaced by that server's last reply."""
    results: list[tuple[int, list]] = []
    replies: dict[tuple[int, ...], list[int]] = {}
    for tenant, prompt in trace:
        ids: list[int] = []
        for token in prompt:
            ids.extend(replies[tuple(ids)] if token == REPLY else [token])
        out = send(tenant, ids)
        replies[tuple(ids)] = list(out["output_ids"])
        results.append((int(out["meta_info"]["cached_tokens"]), list(out["output_ids"])))
    return results


def upstream_under_extra_key(server: ServerProcess, new_tokens: int) -> Callable[[str, list[int]], dict]:
    """A sender for :func:`run_trace` against plain upstream: each tenant's requests under its own ``extra_key``
    (SGLang's tree keeps them apart), greedy, ``new_tokens`` tokens."""

    def send(tenant: str, ids: list[int]) -> dict:
        sampling = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        body = {"input_ids": ids, "sampling_params": sampling, "extra_key": tenant}
        status, out = server.post("/generate", body, timeout_s=300)
        assert status == 200, out
        return out

    return send
