"""Speculative decoding with a draft model and tenants, end to end on CPU: STANDALONE, EAGLE, EAGLE3, NEXTN.

One server per algorithm: the owner check on, a tenants file, Triton attention in its interpreter. STANDALONE
drafts with the bundled model itself; EAGLE, EAGLE3 and NEXTN (MTP; SGLang runs it as EAGLE) with small seeded
heads written by the test ("echo" heads whose drafts the bundled model mostly accepts, so verify passes accept
several tokens). The draft model's KV sits at the target's slot indices, so one tree match hands out both:

* positive control: acme repeating its prompt hits the cache, and the draft KV of every reused token is
  there (a test plugin's counter reads the draft pool at the prefix slots of each prefill);
* isolation: globex sending acme's prompt misses both (no cached tokens, no reused draft KV);
* the counter reads the draft pool: after acme's draft KV is zeroed (test plugin command), acme's next hit
  reuses target KV but finds no draft KV, and its output still does not change;
* an EAGLE-style head's draft KV at a position depends on the next token, so the tree is keyed by token pairs:
  a prompt agreeing with an earlier one on k tokens reuses k positions with STANDALONE and k - 1 with the others;
* forced corruption on a draft pass: a foreign slot planted into a row at the start of a decode step, before
  the draft plans attention, is redirected to the zero page and the request aborted;
* lossless: every output equals the greedy output built one prefill at a time, up to a float tie;
* accept statistics: per request in the caller's own meta_info; /metrics and server info are admin only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso_testing import spec_plant
from sglang_iso_testing.eagle_head import write_eagle_head
from sglang_iso_testing.plant import COMMAND as PLANT
from sglang_iso_testing.process import ServerProcess

from .helpers import (
    NEW_TOKENS,
    TENANTS,
    assert_greedy_equal,
    auth,
    generate_ids,
    greedy_one_by_one,
    random_prompt,
    spec_server,
)

pytestmark = pytest.mark.e2e

PROMPT_LEN = 40
# `make test-extended` serves EAGLE and EAGLE3 here too: NEXTN runs as EAGLE (the same head, the pair-keyed tree) in
# the tree draft layout, and EAGLE's chain layout runs in the speculative leak fuzzer; EAGLE3 differs from EAGLE in
# the head (hidden states of three layers) only
ALGORITHMS = (
    "STANDALONE",
    pytest.param("EAGLE", marks=pytest.mark.extended),
    pytest.param("EAGLE3", marks=pytest.mark.extended),
    "NEXTN",
)
PAIR_KEYED = ("EAGLE", "EAGLE3", "NEXTN")  # an EAGLE-style head (NEXTN/MTP runs as EAGLE): the tree keys by pairs


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    from sglang_iso.tenancy.keys import new_api_key

    return {name: new_api_key() for name in (*TENANTS, "admin")}


@pytest.fixture(scope="module", params=ALGORITHMS)
def algorithm(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str], algorithm: str) -> Iterator[ServerProcess]:
    if algorithm == "STANDALONE":
        draft = tiny_model_path()
    else:
        kind = "EAGLE3" if algorithm == "EAGLE3" else "EAGLE"
        draft = write_eagle_head(tmp_path_factory.mktemp("eagle-head"), kind=kind, echo=True)
    # NOTE: NEXTN drafts a tree (top-2 per step, 6 draft tokens), the others a chain: both draft layouts run
    topk, drafts = ("2", "6") if algorithm == "NEXTN" else ("1", "4")
    yield from spec_server(
        tmp_path_factory, keys, "--speculative-algorithm", algorithm,
        "--speculative-draft-model-path", str(draft), "--speculative-num-steps", "3",
        "--speculative-eagle-topk", topk, "--speculative-num-draft-tokens", drafts,
    )  # fmt: skip


def _prompt() -> list[int]:
    return random_prompt(PROMPT_LEN)


def _state(server: ServerProcess, keys: dict[str, str]) -> dict:
    status, info = server.get_with("/get_server_info", auth(keys["admin"]))
    assert status == 200
    return info["internal_states"][0]["sglang_iso"]


def _testing(server: ServerProcess, keys: dict[str, str]) -> dict:
    status, info = server.get_with("/get_server_info", auth(keys["admin"]))
    assert status == 200
    return info["internal_states"][0]["sglang_iso_testing"]


def _reused(server: ServerProcess, keys: dict[str, str]) -> int:
    return int(_testing(server, keys)["draft_kv_reused_tokens"])


def _admin(server: ServerProcess, keys: dict[str, str], command: str) -> None:
    status, out = server.post("/set_internal_state", {"server_args": {command: 1}}, headers=auth(keys["admin"]))
    assert status == 200 and out == [True], out


def test_target_and_draft_kv_reused_within_a_tenant_only_and_output_is_lossless(
    server: ServerProcess, keys: dict[str, str], algorithm: str
) -> None:
    prompt = _prompt()
    before = _reused(server, keys)
    first = generate_ids(server, keys["acme"], prompt)
    assert first["meta_info"]["spec_verify_ct"] > 0, first["meta_info"]  # it did speculate
    assert first["meta_info"]["cached_tokens"] == 0
    after_first = _reused(server, keys)
    assert after_first == before

    repeat = generate_ids(server, keys["acme"], prompt)  # positive control: target and draft KV reused
    cached = repeat["meta_info"]["cached_tokens"]
    # the scheduler looks up all tokens but the last; pair keys cover one position fewer
    assert cached == PROMPT_LEN - (2 if algorithm in PAIR_KEYED else 1), repeat["meta_info"]
    after_repeat = _reused(server, keys)
    assert after_repeat - after_first == cached  # the draft KV of every reused token was there

    other = generate_ids(server, keys["globex"], prompt)  # isolation: globex misses both
    assert other["meta_info"]["cached_tokens"] == 0, other["meta_info"]
    assert _reused(server, keys) == after_repeat

    _admin(server, keys, spec_plant.ZERO_DRAFT + "acme")  # the counter really reads the draft pool
    zeroed = generate_ids(server, keys["acme"], prompt)
    assert zeroed["meta_info"]["cached_tokens"] == cached
    assert _reused(server, keys) == after_repeat  # target KV reused, draft KV found zero

    reference, gaps = greedy_one_by_one(server, keys["initech"], prompt)
    for r in (first, repeat, other, zeroed):
        assert_greedy_equal(r["output_ids"], reference, gaps)
    tree = _state(server, keys)["tree_cache"]
    assert tree["draft_buffers"] > 0 and tree["owner_draft_step_checks"] > 0  # draft pool scrubbed, steps checked
    assert tree["owner_violations"] == 0  # no false positives on draft, verify or draft-extend passes


def test_reuse_stops_where_the_draft_kv_depends_on_a_different_next_token(
    server: ServerProcess, keys: dict[str, str], algorithm: str
) -> None:
    prompt = _prompt()
    first = generate_ids(server, keys["acme"], prompt)
    agree = PROMPT_LEN - 10
    fork = [*prompt[:agree], *random_prompt(10)]
    fork[agree] = prompt[agree] + 1  # differs from token ``agree`` on
    before = _reused(server, keys)
    forked = generate_ids(server, keys["acme"], fork)
    # STANDALONE: the agreeing tokens; EAGLE: one fewer (that position's draft KV was made with prompt[agree] next)
    expected = agree - 1 if algorithm in PAIR_KEYED else agree
    assert forked["meta_info"]["cached_tokens"] == expected, (algorithm, forked["meta_info"])
    assert _reused(server, keys) - before == expected  # draft KV of exactly those positions
    other = generate_ids(server, keys["globex"], fork)  # isolation: globex misses both
    assert other["meta_info"]["cached_tokens"] == 0, other["meta_info"]
    reference, gaps = greedy_one_by_one(server, keys["initech"], fork)
    for r in (forked, other):
        assert_greedy_equal(r["output_ids"], reference, gaps)
    if algorithm != "STANDALONE":  # the echo head's drafts are accepted: the draft model really ran
        assert first["meta_info"]["spec_accept_length"] > 1, first["meta_info"]


@pytest.mark.parametrize(
    "kind",
    [
        "draft",  # at the decode step's entry, before the draft plans attention
        "draft_forward",  # at a draft model forward (the first is the prefill's draft extend)
    ],
)
def test_planted_foreign_slot_in_a_draft_pass_is_refused(
    server: ServerProcess, keys: dict[str, str], kind: str
) -> None:
    generate_ids(server, keys["globex"], _prompt())  # globex owns pages
    before = _state(server, keys)["tree_cache"]
    planted_before = _testing(server, keys)["planted_read_zero"]
    _admin(server, keys, f"{PLANT}{kind}:acme")
    status, out = server.post(
        "/generate",
        {"input_ids": _prompt(), "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0}},
        headers=auth(keys["acme"]),
    )
    aborted = status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
    assert (aborted or 400 <= status < 500) and "isolation violation" in str(out), (status, out)
    after = _state(server, keys)["tree_cache"]
    assert after["owner_violations"] > before["owner_violations"]
    assert _testing(server, keys)["planted_read_zero"] > planted_before  # zero in target and draft pools
    assert "TEST plant" in server.log_text()
    again = generate_ids(server, keys["acme"], _prompt())  # served normally afterwards
    assert again["meta_info"]["finish_reason"]["type"] == "length"


def test_accept_stats_per_request_or_admin_only(server: ServerProcess, keys: dict[str, str]) -> None:
    own = generate_ids(server, keys["hooli"], _prompt())
    assert own["meta_info"]["spec_accept_length"] >= 1  # the caller's own request only
    for path in ("/get_server_info", "/metrics"):
        status, _ = server.get_with(path, auth(keys["acme"]))
        assert status == 403, path
    status, metrics = server.get_with("/metrics", auth(keys["admin"]))  # positive control
    assert status == 200 and "sglang:spec_accept_length" in str(metrics)  # one server-wide aggregate


def test_every_free_page_is_zero_in_target_and_draft_pools(server: ServerProcess, keys: dict[str, str]) -> None:
    # Poison and check end to end: after real traffic (request releases free the speculative over-allocation,
    # a tenant flush frees tree pages), every free page is zero in the target's and the draft's buffers.
    generate_ids(server, keys["globex"], _prompt())
    _admin(server, keys, "sglang_iso.flush:acme")
    _admin(server, keys, spec_plant.FREE_PAGES_ZERO + ":selftest")  # a planted non-zero free page is found
    _admin(server, keys, spec_plant.FREE_PAGES_ZERO)
    assert _testing(server, keys)["free_pages_holding_data"] == 0
