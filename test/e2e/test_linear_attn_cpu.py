"""Hybrid linear-attention models served on CPU, upstream and through sglang-iso with tenants.

Every test runs on two models (the module's ``model`` fixture), each with its own servers: a tiny Qwen3-Next (GDN
layers) and a tiny Nemotron-H (``sglang_iso_testing/tiny_nemotron_h.py``: Mamba2, MLP and full-attention layers,
whose Mamba2 layers run the torch stand-ins of ``platform/mamba2_cpu.py``; their state is a convolution window and
an SSM state per layer, in the same ``MambaPool``). Upstream's greedy tokens equal those of transformers' own model
on the same checkpoint, for a prompt and for its continuation served from the state snapshot.

The tiny Qwen3-Next (``sglang_iso_testing/tiny_qwen3_next.py``: GDN and full attention layers in turn, MoE, seeded
weights) runs its GDN layers on the torch stand-ins of ``platform/linear_attn_cpu.py`` at SGLang's own call sites.
Upstream SGLang (``python -m sglang_iso.baseline_server``) serves it deterministically. sglang-iso serves it with a
tenants file, the owner check on and the test plugins loaded: its tree is SGLang's unified tree with the Mamba
component (a node's recurrent state snapshot is copied into a matching request's own slot) under the namespace
check (``integration/hybrid_cache.py``). In one run, with positive controls: a tenant's continuation of its own
conversation hits the cache (prompt, output and state) while the same tokens from another tenant miss, and both
give the same tokens (up to a float tie between two); a forged tag shares nothing; a planted foreign KV slot is
redirected and the request aborted; after pool pressure every free KV page is zero; an erase drops only its tenant's
nodes. Flags the hybrid tree does not cover are refused at start, naming them.

The seeded weights make every reply depend on its whole context: a hit on a state snapshot gives the tokens a
recomputation gives, and the same last tokens after another context give another first-token log-probability (shown
in the same run; the greedy tokens themselves may coincide), so equal outputs say that the reused state is the right
one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso import envvars
from sglang_iso_testing.forge_tag import MARKER
from sglang_iso_testing.forge_tag import __name__ as FORGE_PLUGIN
from sglang_iso_testing.plant import COMMAND as PLANT
from sglang_iso_testing.plant import plant_env
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port, iso_server_argv, request_json
from sglang_iso_testing.spec_plant import FREE_STATE_ZERO
from sglang_iso_testing.tenants import write_tenants_file as write_tenants
from sglang_iso_testing.tiny_nemotron_h import write_tiny_nemotron_h
from sglang_iso_testing.tiny_qwen3_next import SERVE_FLAGS, write_tiny_qwen3_next

from .helpers import (
    assert_free_pages_zero_after_pressure,
    assert_greedy_equal,
    assert_planted_slot_aborts,
    auth,
    conversation_trace,
    generate_to_length,
    internal_command,
    post_ids,
    random_prompt,
    run_trace,
    server_info,
    tree_state,
    upstream_under_extra_key,
)

pytestmark = pytest.mark.e2e

POOL_TOKENS = 2048
SIZES = ("--max-total-tokens", str(POOL_TOKENS), "--max-running-requests", "4")
ISO_FLAGS = tuple(f for f in SERVE_FLAGS if f not in ("--mamba-radix-cache-strategy", "no_buffer"))
"""The serving flags without the state strategy: the launcher adds it for hybrid models."""
NEW_TOKENS = 6
HOOLI_QUOTA = 64
"""hooli's ``quota_tokens``: one exchange of a 40-token prompt fits, two do not."""


WRITERS = {"qwen3-next": write_tiny_qwen3_next, "nemotron-h": write_tiny_nemotron_h}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return WRITERS[request.param](tmp_path_factory.mktemp(f"tiny-{request.param}"))


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    from sglang_iso.tenancy.keys import new_api_key

    return {name: new_api_key() for name in ("acme", "globex", "initech", "hooli", "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Path, keys: dict[str, str]) -> Iterator[ServerProcess]:
    tenants = {
        "acme": {"cache": "private"}, "globex": {"cache": "private"}, "initech": {"cache": "off"},
        "hooli": {"cache": "private", "quota_tokens": HOOLI_QUOTA},
    }  # fmt: skip
    path = write_tenants(tmp_path_factory.mktemp("tenants"), tenants, keys=keys).path
    port = free_port()
    argv = iso_server_argv(port, model, *SIZES, *ISO_FLAGS, "--tenants-file", str(path), "--enable-metrics")
    env = plant_env()
    env[envvars.TEST_PLUGINS.name] += "," + FORGE_PLUGIN
    srv = ServerProcess(argv, port, env=env)
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


def _conversation(srv: ServerProcess, key: str, prompt: list[int]) -> tuple[list[int], dict]:
    """The prompt, then its continuation (prompt + output + a new turn); returns the continuation and its reply."""
    first = generate_to_length(srv, key, prompt, NEW_TOKENS)
    assert first["meta_info"]["cached_tokens"] == 0
    follow = [*prompt, *first["output_ids"], *random_prompt(9)[1:]]
    return follow, generate_to_length(srv, key, follow, NEW_TOKENS)


def _scored(srv: ServerProcess, key: str, ids: list[int]) -> dict:
    """:func:`generate_to_length` with the output tokens' log-probabilities and each step's top two."""
    status, out = post_ids(srv, key, ids, NEW_TOKENS, return_logprob=True, top_logprobs_num=2)
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] == "length", (status, out)
    return out


def _gaps(out: dict) -> list[float]:
    """Each step's log-probability gap between its top two tokens. A state snapshot and a recomputation of the
    same context differ in the last bits (a chunked scan against a step-by-step one; about 2e-4 in the first
    token's log-probability at the median), so where two tokens tie the greedy choice may go either way."""
    return [top[0][0] - top[1][0] for top in out["meta_info"]["output_top_logprobs"]]


def _first_logprob(out: dict) -> float:
    """The log-probability of the first output token (the greedy one: a float that moves with any change of the
    state, where the greedy token itself may not)."""
    return float(out["meta_info"]["output_token_logprobs"][0][0])


def test_served_with_the_hybrid_tree_state_scrub_and_owner_check(server: ServerProcess, keys: dict[str, str]) -> None:
    info = server_info(server, keys["admin"])
    assert info["mamba_radix_cache_strategy"] == "no_buffer"  # added by the launcher
    tree = tree_state(server, keys["admin"])
    assert tree["impl"] == "TenantHybridCache" and tree["kv_pool"] == "HybridLinearKVPool"
    assert tree["state_pool"] == "MambaPool"
    assert tree["kv_scrub"] == "on-free" and tree["state_scrub"] == "on-free" and tree["kv_owner_check"] == "on"


def test_a_tenants_continuation_hits_its_state_another_tenant_misses_with_the_same_tokens(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    follow, hit = _conversation(server, keys["acme"], random_prompt(40))
    cached = hit["meta_info"]["cached_tokens"]
    assert cached >= 40  # positive control: prompt and output, with the state at their end
    other = _scored(server, keys["globex"], follow)  # isolation: the same tokens
    assert other["meta_info"]["cached_tokens"] == 0
    assert_greedy_equal(hit["output_ids"], other["output_ids"], _gaps(other))  # a hit computes what a miss does
    elsewhere = _scored(server, keys["globex"], [*random_prompt(40), *follow[-8:]])  # same last tokens, other context
    assert _first_logprob(elsewhere) != _first_logprob(other)  # the reply depends on the state before those tokens
    off = generate_to_length(server, keys["initech"], follow, NEW_TOKENS)  # cache off: never shares
    assert off["meta_info"]["cached_tokens"] == 0
    tree = tree_state(server, keys["admin"])
    assert tree["violations"] == 0 and tree["hybrid_hit_tokens"] >= cached


def test_differential_against_upstream_on_a_random_multi_tenant_trace(
    server: ServerProcess, upstream: ServerProcess, keys: dict[str, str]
) -> None:
    """The same trace through upstream (each tenant's requests under its own ``extra_key``: SGLang's tree keeps
    them apart) and through sglang-iso (each tenant's key): every request's cached tokens and output tokens equal.
    Upstream's own tree is the oracle of where state snapshots exist and hit; the trace has hits in both servers
    (control) and cross-tenant sends of the same tokens."""
    trace = conversation_trace(seed=7, steps=16)

    def iso(tenant: str, ids: list[int]) -> dict:
        return generate_to_length(server, keys[tenant], ids, NEW_TOKENS)

    ours, theirs = run_trace(trace, iso), run_trace(trace, upstream_under_extra_key(upstream, NEW_TOKENS))
    assert sum(1 for cached, _ in theirs if cached > 0) >= 3  # the trace reuses state in upstream
    assert ours == theirs


def _text_continuation_cached(srv: ServerProcess, key: str, text: str) -> int:
    """A text prompt, then its continuation (prompt + reply + more); the continuation's cached tokens."""
    body = {"text": text, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}
    status, first = srv.post("/generate", body, headers=auth(key))
    assert status == 200 and first["meta_info"]["cached_tokens"] == 0, first
    body["text"] = text + first["text"] + " and the next line, please"
    status, follow = srv.post("/generate", body, headers=auth(key))
    assert status == 200, follow
    return int(follow["meta_info"]["cached_tokens"])


def test_a_forged_tag_shares_nothing_and_the_tenants_own_tag_still_hits(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    """Requests whose tag the forge plugin rewrites (MAC of zeros) behind the gate: served, never a hit, counted;
    the same conversation with the tenant's own tag hits (control)."""
    before = tree_state(server, keys["admin"])["rejected_tags"]
    assert _text_continuation_cached(server, keys["acme"], f"{MARKER} q3 figures of acme, line by line:") == 0
    assert tree_state(server, keys["admin"])["rejected_tags"] >= before + 2
    assert _text_continuation_cached(server, keys["acme"], "q3 figures of acme, line by line:") > 0


def test_a_planted_foreign_slot_is_redirected_and_the_request_aborted(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    assert_planted_slot_aborts(server, keys, 40, NEW_TOKENS)


def test_a_planted_foreign_state_snapshot_is_redirected_and_the_request_aborted(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    """globex leaves a state snapshot in the tree; acme's next forward is pointed at it (the plug-in, behind the
    tree): the state check sends the row to the zero state slot, the request is aborted and counted; acme's next
    request is served (control) and globex's conversation still hits its snapshot."""
    globex_follow, _ = _conversation(server, keys["globex"], random_prompt(40))
    before = tree_state(server, keys["admin"])["owner_state_violations"]
    assert internal_command(server, keys["admin"], PLANT + "state:acme")
    status, out = post_ids(server, keys["acme"], random_prompt(12), NEW_TOKENS)
    aborted = status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
    assert (aborted or 400 <= status < 500) and "isolation violation" in str(out), (status, out)
    assert tree_state(server, keys["admin"])["owner_state_violations"] == before + 1
    plugin = server_info(server, keys["admin"])["internal_states"][0]["sglang_iso_testing"]
    assert plugin["planted_state_redirected"] >= 1
    generate_to_length(server, keys["acme"], random_prompt(12), NEW_TOKENS)  # served normally afterwards
    again = generate_to_length(server, keys["globex"], globex_follow, NEW_TOKENS)
    assert again["meta_info"]["cached_tokens"] >= 40


def test_after_pool_pressure_every_free_page_and_state_slot_is_zero(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    """KV pages (the helper) and recurrent-state slots: the check's self-test dirties one free slot of each state
    tensor in turn and must find it, then no free slot may hold a non-zero value."""
    assert internal_command(server, keys["admin"], FREE_STATE_ZERO + ":selftest")
    assert_free_pages_zero_after_pressure(server, keys, POOL_TOKENS, NEW_TOKENS)
    assert tree_state(server, keys["admin"])["state_scrubbed_slots"] > 0
    assert internal_command(server, keys["admin"], FREE_STATE_ZERO)


def test_a_quota_keeps_the_tenants_latest_exchange_and_evicts_its_older_one(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    """hooli's two conversations do not fit its quota together: its next request finds the older one's nodes (KV
    and state) evicted, the newer one's kept (control), and acme's conversation, older than both, untouched."""
    acme_follow, _ = _conversation(server, keys["acme"], random_prompt(40))
    before = tree_state(server, keys["admin"])["hybrid_quota_evicted_tokens"]
    older, _ = _conversation(server, keys["hooli"], random_prompt(40))
    newer, _ = _conversation(server, keys["hooli"], random_prompt(40))
    assert generate_to_length(server, keys["hooli"], newer, NEW_TOKENS)["meta_info"]["cached_tokens"] >= 40
    assert generate_to_length(server, keys["hooli"], older, NEW_TOKENS)["meta_info"]["cached_tokens"] == 0
    assert tree_state(server, keys["admin"])["hybrid_quota_evicted_tokens"] > before
    assert generate_to_length(server, keys["acme"], acme_follow, NEW_TOKENS)["meta_info"]["cached_tokens"] >= 40
    time.sleep(1.5)  # the scheduler exports its rows at most once a second: the next lookup exports these
    generate_to_length(server, keys["acme"], random_prompt(12), NEW_TOKENS)
    status, body = server.get_with("/metrics", auth(keys["admin"]))
    assert status == 200
    assert 'sglang_iso:evicted_tokens_total{tenant="hooli"}' in body  # the quota's evictions, per tenant
    assert 'sglang_iso:resident_tokens{tenant="acme"}' in body
    assert 'sglang_iso:quota_tokens{tenant="hooli"} 64.0' in body


def test_an_erase_drops_the_tenants_nodes_and_keeps_the_others(server: ServerProcess, keys: dict[str, str]) -> None:
    acme_follow, _ = _conversation(server, keys["acme"], random_prompt(40))
    globex_follow, _ = _conversation(server, keys["globex"], random_prompt(40))
    status, receipt = server.post("/iso/tenants/acme/erase", {}, headers=auth(keys["admin"]))
    assert status == 200 and receipt["erased"], receipt
    again = generate_to_length(server, keys["acme"], acme_follow, NEW_TOKENS)
    assert again["meta_info"]["cached_tokens"] == 0  # acme's nodes are gone
    kept = generate_to_length(server, keys["globex"], globex_follow, NEW_TOKENS)
    assert kept["meta_info"]["cached_tokens"] >= 40  # control: globex's are not


@pytest.fixture(scope="module")
def upstream(model: Path) -> Iterator[ServerProcess]:
    port = free_port()
    srv = ServerProcess(baseline_server_argv(port, model, *SIZES, *SERVE_FLAGS), port)
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


def _upstream(server: ServerProcess, ids: list[int]) -> dict:
    """A greedy ``/generate`` of :data:`NEW_TOKENS` tokens (EOS ignored) on the upstream server (no key)."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}
    status, out = request_json(server.base_url + "/generate", body)
    assert status == 200, out
    return out


def _generate(server: ServerProcess, ids: list[int]) -> list[int]:
    return list(_upstream(server, ids)["output_ids"])


def test_upstream_serves_the_linear_layers_on_cpu_deterministically(upstream: ServerProcess) -> None:
    first = [3 + (7 * i) % 1900 for i in range(40)]
    second = [5 + (11 * i) % 1900 for i in range(24)]
    a = _generate(upstream, first)
    b = _generate(upstream, second)
    assert len(a) == NEW_TOKENS and len(b) == NEW_TOKENS
    assert _generate(upstream, first) == a  # greedy: the same prompt gives the same tokens
    assert _generate(upstream, second) == b


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--speculative-algorithm", "NGRAM"), "--speculative-algorithm with hybrid SSM/Mamba models"),
    ],
)
def test_uncovered_flags_are_refused_at_start_by_name(model: Path, flags: tuple[str, ...], named: str) -> None:
    """The launcher refuses them before SGLang starts (the served tests above are the control)."""
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_iso.launch_server", "--model-path", str(model), *SIZES, *ISO_FLAGS, *flags],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    assert named in proc.stdout + proc.stderr


def _reference(model: Path, ids: list[int]) -> list[int]:
    """Greedy tokens of transformers' own model (its torch reference path) on the same checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return [int(t) for t in out[0, len(ids) :]]


def test_upstream_equals_the_transformers_model_on_a_prompt_and_its_state_hit(
    upstream: ServerProcess, model: Path
) -> None:
    """The stand-ins compute the model (a prompt's tokens equal the reference's), and a continuation served from the
    prompt's state snapshot equals the reference's recomputation of the whole context."""
    prompt = [1, *(300 + (37 * i) % 1700 for i in range(39))]
    first = _upstream(upstream, prompt)
    assert first["output_ids"] == _reference(model, prompt)
    follow = [*prompt, *first["output_ids"], 500, 600, 700]
    again = _upstream(upstream, follow)
    assert again["meta_info"]["cached_tokens"] >= len(prompt)  # served from the prompt's state snapshot
    assert again["output_ids"] == _reference(model, follow)
