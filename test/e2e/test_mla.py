"""The DeepSeek family under the guarantees: MLA latent cache, MoE layers, MTP, end to end on CPU.

A tiny DeepSeek-V3-shaped model written by the test (``sglang_iso_testing.tiny_deepseek``: MLA, a dense
then an MoE layer, an MoE MTP layer, seeded weights) served by the real scheduler with a tenants file, the
owner check on and the test plugin loaded, twice:

* ``torch_native``: the CPU default (absorbed MLA for every pass, ``platform/mla_cpu.py``);
* ``triton-mtp``: Triton attention in its interpreter with NEXTN (MTP) drafting from the model's own layer
  (SGLang runs it as EAGLE, so the tree is keyed by token pairs).

On each, with its positive control in the same run: the same tenant's repeat hits the cache while another
tenant misses, and every output equals the no-cache one (a prompt no tenant sent before; with MTP its first
token, as upstream's MTP is not lossless on this model on CPU); forged scheduling
fields are refused naming the field while the same request without them is served; a foreign slot planted
into a request's row is redirected to the zero page and the request aborted while the tenant's next request
is served; after pool pressure every free page is zero in the latent pool (and the draft's), where a free
page dirtied on purpose is found first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso_testing.plant import plant_env
from sglang_iso_testing.process import ServerProcess, ServerStartError, free_port, iso_server_argv
from sglang_iso_testing.tiny_deepseek import DTYPE_FLAGS, MTP_FLAGS, write_tiny_deepseek

from .helpers import (
    TENANTS,
    assert_free_pages_zero_after_pressure,
    assert_greedy_equal,
    assert_planted_slot_aborts,
    generate_to_length,
    greedy_one_by_one,
    post_ids,
    random_prompt,
    server_info,
    tree_state,
    write_tenants_file,
)

pytestmark = pytest.mark.e2e

PROMPT_LEN = 40
NEW_TOKENS = 8
# NOTE: small pools so that the pressure test evicts; Triton in its interpreter prefills about 50x slower.
POOL_TOKENS = {"torch_native": 2048, "triton-mtp": 512}
VARIANTS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {  # name -> (server env, flags)
    "torch_native": ({}, ()),
    "triton-mtp": ({"TRITON_INTERPRET": "1"}, ("--attention-backend", "triton", *MTP_FLAGS)),
}


def _sizes(variant: str) -> tuple[str, ...]:
    return ("--max-total-tokens", str(POOL_TOKENS[variant]), "--max-running-requests", "8")


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    from sglang_iso.tenancy.keys import new_api_key

    return {name: new_api_key() for name in (*TENANTS, "admin")}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str], variant: str) -> Iterator[ServerProcess]:
    model = write_tiny_deepseek(tmp_path_factory.mktemp("tiny-deepseek"))
    tenants = write_tenants_file(tmp_path_factory.mktemp("tenants"), keys)
    env, flags = VARIANTS[variant]
    port = free_port()
    argv = iso_server_argv(port, model, *_sizes(variant), *DTYPE_FLAGS, "--tenants-file", str(tenants), *flags)
    srv = ServerProcess(argv, port, env={**plant_env(), **env})
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


def test_served_on_the_latent_pool_with_scrub_and_owner_check(
    server: ServerProcess, keys: dict[str, str], variant: str
) -> None:
    info = server_info(server, keys["admin"])
    assert info["attention_backend"] == ("triton" if variant == "triton-mtp" else "torch_native")
    tree = tree_state(server, keys["admin"])
    assert tree["kv_pool"] == "MLATokenToKVPool"
    assert tree["kv_scrub"] == "on-free" and tree["kv_owner_check"] == "on"
    if variant == "triton-mtp":
        assert tree["draft_buffers"] > 0  # the MTP layer's latent pool is scrubbed with the target's


def test_same_tenant_hits_other_tenant_misses_and_outputs_equal_the_uncached_one(
    server: ServerProcess, keys: dict[str, str], variant: str
) -> None:
    prompt = random_prompt(PROMPT_LEN)
    first = generate_to_length(server, keys["acme"], prompt, NEW_TOKENS)
    assert first["meta_info"]["cached_tokens"] == 0
    repeat = generate_to_length(server, keys["acme"], prompt, NEW_TOKENS)  # positive control
    # the scheduler looks up all tokens but the last; MTP's pair keys cover one position fewer
    assert repeat["meta_info"]["cached_tokens"] == PROMPT_LEN - (2 if variant == "triton-mtp" else 1)
    other = generate_to_length(server, keys["globex"], prompt, NEW_TOKENS)  # isolation
    assert other["meta_info"]["cached_tokens"] == 0
    if variant == "triton-mtp":
        # NOTE: upstream SGLang's MTP on this model is not lossless on CPU: plain SGLang gives two identical
        # greedy requests outputs that part after a few tokens. The first token comes from the prefill alone
        # (a fresh prefill runs MLA decompressed, a cached prefix absorbed: a float tie may break either way).
        reference, gaps = greedy_one_by_one(server, keys["initech"], prompt, 1)  # initech: cache off
        for r in (first, repeat, other):
            assert_greedy_equal(r["output_ids"][:1], reference, gaps)
    else:
        assert repeat["output_ids"] == first["output_ids"] == other["output_ids"]
    reordered = [prompt[0], *reversed(prompt[1:])]
    different = generate_to_length(server, keys["acme"], reordered, NEW_TOKENS)  # the output depends on the context
    assert different["output_ids"] != first["output_ids"]
    if variant == "triton-mtp":
        assert first["meta_info"]["spec_verify_ct"] > 0  # it did draft with the MTP layer
    assert tree_state(server, keys["admin"])["owner_violations"] == 0


def test_forged_fields_are_refused_naming_them(server: ServerProcess, keys: dict[str, str]) -> None:
    prompt = random_prompt(12)
    for field, value in (("extra_key", "globex"), ("bootstrap_room", 1), ("data_parallel_rank", 0)):
        status, out = post_ids(server, keys["acme"], prompt, NEW_TOKENS, **{field: value})
        assert status == 400 and out["error"]["param"] == field, (field, out)
    generate_to_length(server, keys["acme"], prompt, NEW_TOKENS)  # the same request without the field is served


def test_a_planted_foreign_slot_is_redirected_and_the_request_aborted(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    assert_planted_slot_aborts(server, keys, PROMPT_LEN, NEW_TOKENS)
    testing = server_info(server, keys["admin"])["internal_states"][0]["sglang_iso_testing"]
    assert testing["planted_read_zero"] >= 1  # the planted slot pointed into the all-zero latent page


def test_after_pool_pressure_every_free_latent_page_is_zero(
    server: ServerProcess, keys: dict[str, str], variant: str
) -> None:
    assert_free_pages_zero_after_pressure(server, keys, POOL_TOKENS[variant], NEW_TOKENS)  # target and draft pool


@pytest.fixture
def dsa_model(tmp_path: Path) -> Path:
    return write_tiny_deepseek(tmp_path / "tiny-dsa", dsa=True)


def test_a_dsa_model_is_refused_at_start_by_name(dsa_model: Path) -> None:
    port = free_port()
    srv = ServerProcess(iso_server_argv(port, dsa_model, *_sizes("torch_native")), port)
    with pytest.raises(ServerStartError) as err:
        srv.start(timeout_s=120)
    srv.keep_log = False  # an expected refusal: its log tail is in the error
    srv.stop()
    assert "does not support DSA sparse attention models on --device cpu" in str(err.value)
    assert "SGLang's DSA indexer has no CPU path" in str(err.value)
