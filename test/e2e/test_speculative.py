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

from collections.abc import Iterator

import pytest

from sglang_iso_testing.plant import COMMAND as PLANT
from sglang_iso_testing.process import ServerProcess

from .helpers import NEW_TOKENS, assert_greedy_equal, auth, generate_ids, greedy_one_by_one, random_prompt, spec_server

pytestmark = pytest.mark.e2e

TENANTS = ("acme", "globex", "initech", "hooli", "hooli-eu")
DRAFTS = 8


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    from sglang_iso.tenancy.keys import new_api_key

    return {name: new_api_key() for name in (*TENANTS, "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    yield from spec_server(
        tmp_path_factory, keys, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(DRAFTS)
    )


def test_accept_length_follows_own_namespace_only_and_output_is_lossless(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    prompt = random_prompt()
    first = generate_ids(server, keys["acme"], prompt)
    repeat = generate_ids(server, keys["acme"], prompt)
    other = generate_ids(server, keys["globex"], prompt)
    accept = {name: r["meta_info"]["spec_accept_length"] for name, r in (("first", first), ("repeat", repeat),
              ("other", other))}  # fmt: skip
    assert first["meta_info"]["spec_verify_ct"] > 0, first["meta_info"]  # it did speculate
    assert accept["repeat"] > accept["first"], accept  # positive control: acme's own corpus
    assert accept["other"] == accept["first"], accept  # globex drafts from an empty corpus, as acme first did
    assert accept["other"] < accept["repeat"], accept

    off_first = generate_ids(server, keys["initech"], prompt)  # initech's cache policy is "off"
    off_again = generate_ids(server, keys["initech"], prompt)
    assert off_again["meta_info"]["spec_accept_length"] == off_first["meta_info"]["spec_accept_length"]
    assert off_again["meta_info"]["spec_accept_length"] < accept["repeat"]  # its text was kept nowhere

    reference, gaps = greedy_one_by_one(server, keys["initech"], prompt)
    for r in (first, repeat, other, off_first, off_again):
        assert_greedy_equal(r["output_ids"], reference, gaps)


def _cache_status(server: ServerProcess, keys: dict[str, str]) -> dict:
    status, info = server.get_with("/get_server_info", auth(keys["admin"]))
    assert status == 200
    return info["internal_states"][0]["sglang_iso"]["tree_cache"]


def _plant_status(server: ServerProcess, keys: dict[str, str]) -> dict:
    status, info = server.get_with("/get_server_info", auth(keys["admin"]))
    assert status == 200
    return info["internal_states"][0]["sglang_iso_testing"]


def test_planted_foreign_slot_in_a_verify_pass_is_refused(server: ServerProcess, keys: dict[str, str]) -> None:
    generate_ids(server, keys["globex"], random_prompt())  # globex owns pages
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
    again = generate_ids(server, keys["acme"], random_prompt())  # served normally afterwards
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


def test_erase_drops_the_tenants_draft_corpus_only(server: ServerProcess, keys: dict[str, str]) -> None:
    """An erase receipt counts the tenant's NGRAM corpora (found through the scheduler's draft worker); the
    other tenants' corpora stay (control: acme's repeat still drafts from acme's earlier output)."""
    admin = auth(keys["admin"])
    prompt = random_prompt()
    fresh = generate_ids(server, keys["acme"], prompt)["meta_info"]["spec_accept_length"]
    generate_ids(server, keys["globex"], prompt)

    def corpora() -> int:
        status, info = server.get_with("/get_server_info", admin)
        assert status == 200
        return int(info["internal_states"][0]["sglang_iso"]["ngram"]["namespace_corpora"])

    before = corpora()
    status, receipt = server.post("/iso/tenants/globex/erase", {}, headers=admin)
    assert status == 200 and receipt["complete"], receipt
    dropped = receipt["totals"]["ngram_corpora_dropped"]
    assert dropped == 1 and corpora() == before - dropped
    globex = generate_ids(server, keys["globex"], prompt)["meta_info"]["spec_accept_length"]
    acme = generate_ids(server, keys["acme"], prompt)["meta_info"]["spec_accept_length"]
    assert globex == fresh < acme, (fresh, globex, acme)  # globex drafts from an empty corpus again, acme not
