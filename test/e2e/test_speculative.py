"""NGRAM speculative decoding with tenants, end to end on CPU (Triton attention in its interpreter).

One server: NGRAM, the owner check on (it now covers the verify pass), a tenants file. The draft corpus is
per namespace, so:

* positive control: acme repeating its own prompt drafts from its own earlier output (longer accepts);
* isolation: globex sending acme's prompt accepts exactly what acme accepted the first time (a fresh
  corpus), never what acme's repeat got; initech (cache policy "off") never drafts from its own past text;
* forced corruption on the verify pass: a foreign slot planted into a row during a verify forward is
  redirected to the zero page and the request aborted;
* lossless: every speculative output equals the greedy output built one token per request
  (``max_new_tokens=1`` requests never decode, so they never speculate), up to a float tie between the top two.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso_testing.plant import COMMAND as PLANT
from sglang_iso_testing.plant import plant_env
from sglang_iso_testing.process import ServerProcess

from .conftest import start_iso_server
from .test_tenants import auth, write_tenants_file

pytestmark = pytest.mark.e2e

TENANTS = ("acme", "globex", "initech", "hooli", "hooli-eu")
NEW_TOKENS = 16
DRAFTS = 8
TIE_LOGPROB = 1e-2  # two tokens this close in logprob are a float tie, not a choice


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    from sglang_iso.tenancy.keys import new_api_key

    return {name: new_api_key() for name in (*TENANTS, "admin")}


def spec_server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str], *flags: str) -> Iterator[ServerProcess]:
    """A tenant-keyed server with Triton attention in its interpreter, the test plugin, and speculative ``flags``."""
    path: Path = write_tenants_file(tmp_path_factory.mktemp("tenants"), keys)
    srv = start_iso_server(
        "--tenants-file", str(path), "--attention-backend", "triton", *flags, "--enable-metrics",
        # NOTE: the Triton backend needs the interpreter on CPU; the plant switch arms only on an admin command
        env={"TRITON_INTERPRET": "1", **plant_env()},
    )  # fmt: skip
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    yield from spec_server(
        tmp_path_factory, keys, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(DRAFTS)
    )


# NOTE: a distinct first token per prompt in the run, because two prompts agreeing on their first token share a
# one-token prefix: a tenant's own earlier prompt would then be a legitimate hit where a test expects none.
_FIRST_IDS = iter(random.Random(uuid.uuid4().int).sample(range(300, 2000), 1700))


def random_prompt(length: int = 24) -> list[int]:
    rng = random.Random(uuid.uuid4().int)
    return [next(_FIRST_IDS), *(rng.randrange(300, 2000) for _ in range(length - 1))]


def _generate(server: ServerProcess, key: str, ids: list[int], new_tokens: int = NEW_TOKENS) -> dict:
    status, out = server.post(
        "/generate",
        {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}},
        headers=auth(key),
    )
    assert status == 200, out
    return out


def _greedy_one_by_one(
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


def _assert_greedy_equal(output: list[int], reference: list[int], gaps: list[float]) -> None:
    """Speculative output equals the reference; it may part from it only where the reference's top two tokens tie.

    A verify pass scores several tokens in one extend, the reference one token per prefill: the float sums differ in
    the last bits, so an exact tie between two tokens can break either way. Anything else is a real difference.
    """
    assert len(output) == len(reference)
    for i, (got, want) in enumerate(zip(output, reference, strict=True)):
        if got != want:
            assert gaps[i] < TIE_LOGPROB, (i, output, reference, gaps)
            return


def test_accept_length_follows_own_namespace_only_and_output_is_lossless(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    prompt = random_prompt()
    first = _generate(server, keys["acme"], prompt)
    repeat = _generate(server, keys["acme"], prompt)
    other = _generate(server, keys["globex"], prompt)
    accept = {name: r["meta_info"]["spec_accept_length"] for name, r in (("first", first), ("repeat", repeat),
              ("other", other))}  # fmt: skip
    assert first["meta_info"]["spec_verify_ct"] > 0, first["meta_info"]  # it did speculate
    assert accept["repeat"] > accept["first"], accept  # positive control: acme's own corpus
    assert accept["other"] == accept["first"], accept  # globex drafts from an empty corpus, as acme first did
    assert accept["other"] < accept["repeat"], accept

    off_first = _generate(server, keys["initech"], prompt)  # initech's cache policy is "off"
    off_again = _generate(server, keys["initech"], prompt)
    assert off_again["meta_info"]["spec_accept_length"] == off_first["meta_info"]["spec_accept_length"]
    assert off_again["meta_info"]["spec_accept_length"] < accept["repeat"]  # its text was kept nowhere

    reference, gaps = _greedy_one_by_one(server, keys["initech"], prompt)
    for r in (first, repeat, other, off_first, off_again):
        _assert_greedy_equal(r["output_ids"], reference, gaps)


def _cache_status(server: ServerProcess, keys: dict[str, str]) -> dict:
    status, info = server.get_with("/get_server_info", auth(keys["admin"]))
    assert status == 200
    return info["internal_states"][0]["sglang_iso"]["tree_cache"]


def _plant_status(server: ServerProcess, keys: dict[str, str]) -> dict:
    status, info = server.get_with("/get_server_info", auth(keys["admin"]))
    assert status == 200
    return info["internal_states"][0]["sglang_iso_testing"]


def test_planted_foreign_slot_in_a_verify_pass_is_refused(server: ServerProcess, keys: dict[str, str]) -> None:
    _generate(server, keys["globex"], random_prompt())  # globex owns pages
    before = _cache_status(server, keys)
    assert before["kv_owner_check"] == "on" and before["owner_violations"] == 0  # no false positives so far
    status, armed = server.post(
        "/set_internal_state", {"server_args": {PLANT + "verify:acme": 1}}, headers=auth(keys["admin"])
    )
    assert status == 200, armed
    status, out = server.post(
        "/generate",
        {"input_ids": random_prompt(), "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0}},
        headers=auth(keys["acme"]),
    )
    aborted = status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort"
    assert (aborted or 400 <= status < 500) and "isolation violation" in str(out), (status, out)
    after = _cache_status(server, keys)
    assert after["owner_violations"] >= 1 and _plant_status(server, keys)["planted_read_zero"] >= 1
    assert "TEST plant" in server.log_text()
    again = _generate(server, keys["acme"], random_prompt())  # served normally afterwards
    assert again["meta_info"]["finish_reason"]["type"] == "length"


def test_accept_stats_only_for_admins(server: ServerProcess, keys: dict[str, str]) -> None:
    status, _ = server.get_with("/get_server_info", auth(keys["acme"]))
    assert status == 403
    status, _ = server.get_with("/metrics", auth(keys["acme"]))
    assert status == 403
    status, info = server.get_with("/get_server_info", auth(keys["admin"]))  # positive control
    assert status == 200
    ngram = info["internal_states"][0]["sglang_iso"]["ngram"]
    assert ngram["corpus"] == "namespace" and ngram["namespace_corpora"] >= 2  # acme's and globex's, at least
