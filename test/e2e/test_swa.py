"""Sliding-window hybrid models under the guarantees, end to end on CPU.

A tiny Laguna-shaped model written by the test (``sglang_iso_testing.tiny_swa``: sliding and full attention
layers in turn, a window of 8 tokens, seeded weights), which SGLang runs as a hybrid SWA model. Through the
launcher it gets ``--disable-hybrid-swa-memory``: every layer's KV in one pool, the sliding window an attention
mask (torch_native). Served with a tenants file, the owner check on and the test plugin loaded; with their
positive controls in the same run: the same tenant's repeat of a prompt five windows long hits the cache while
another tenant misses, and every output equals the no-cache one (the sliding layers of a cached prefix read
only their window); a foreign slot planted into a request's row is redirected to the zero page and the request
aborted; after pool pressure every free page is zero. Started without the launcher's flag (SGLang's own
launcher with the tenant cache), the SWA sub-pool layout is refused on torch_native, naming the backend.

With ``--iso-swa-layout sub-pool`` on Triton (interpreted) the model runs in SGLang's SWA sub-pool layout on the
hybrid tree: same-tenant hit, cross-tenant miss, equal outputs, a differential against upstream's sub-pool server,
both owner checks (a planted full-pool slot, a planted sliding-window map entry: each redirected to a zero page and
the request aborted) and every free page of both sub-pools zero after pressure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso import envvars
from sglang_iso_testing.plant import COMMAND as PLANT
from sglang_iso_testing.plant import plant_env
from sglang_iso_testing.process import (
    ServerProcess,
    ServerStartError,
    baseline_server_argv,
    free_port,
    iso_server_argv,
)
from sglang_iso_testing.tenants import write_tenants_file as write_tenants
from sglang_iso_testing.tiny_swa import DTYPE_FLAGS, WINDOW, write_tiny_swa

from .helpers import (
    TENANTS,
    assert_free_pages_zero_after_pressure,
    assert_planted_slot_aborts,
    conversation_trace,
    generate_to_length,
    internal_command,
    post_ids,
    random_prompt,
    run_trace,
    server_info,
    tree_state,
    upstream_under_extra_key,
    write_tenants_file,
)

pytestmark = pytest.mark.e2e

PROMPT_LEN = 5 * WINDOW
NEW_TOKENS = 8
POOL_TOKENS = 2048
SIZES = ("--max-total-tokens", str(POOL_TOKENS), "--max-running-requests", "8")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_swa(tmp_path_factory.mktemp("tiny-swa"))


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    from sglang_iso.tenancy.keys import new_api_key

    return {name: new_api_key() for name in (*TENANTS, "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Path, keys: dict[str, str]) -> Iterator[ServerProcess]:
    tenants = write_tenants_file(tmp_path_factory.mktemp("tenants"), keys)
    port = free_port()
    argv = iso_server_argv(port, model, *SIZES, *DTYPE_FLAGS, "--tenants-file", str(tenants))
    srv = ServerProcess(argv, port, env=plant_env())
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


def test_served_in_the_one_pool_layout_with_scrub_and_owner_check(server: ServerProcess, keys: dict[str, str]) -> None:
    info = server_info(server, keys["admin"])
    assert info["disable_hybrid_swa_memory"] is True and info["attention_backend"] == "torch_native"
    tree = tree_state(server, keys["admin"])
    assert tree["kv_pool"] == "MHATokenToKVPool"
    assert tree["kv_scrub"] == "on-free" and tree["kv_owner_check"] == "on"
    assert "hybrid_swa=False" in server.log_text()  # SGLang built the one-pool layout for this SWA model


def test_same_tenant_hits_other_tenant_misses_and_outputs_equal_the_uncached_one(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    prompt = random_prompt(PROMPT_LEN)
    first = generate_to_length(server, keys["acme"], prompt, NEW_TOKENS)
    assert first["meta_info"]["cached_tokens"] == 0
    repeat = generate_to_length(server, keys["acme"], prompt, NEW_TOKENS)  # positive control
    assert repeat["meta_info"]["cached_tokens"] == PROMPT_LEN - 1  # all but the last token, SWA layers included
    other = generate_to_length(server, keys["globex"], prompt, NEW_TOKENS)  # isolation
    assert other["meta_info"]["cached_tokens"] == 0
    assert repeat["output_ids"] == first["output_ids"] == other["output_ids"]  # a hit reads what a miss computes
    reordered = [prompt[0], *reversed(prompt[1:])]
    different = generate_to_length(server, keys["acme"], reordered, NEW_TOKENS)  # the output depends on the context
    assert different["output_ids"] != first["output_ids"]
    assert tree_state(server, keys["admin"])["owner_violations"] == 0


def test_a_planted_foreign_slot_is_redirected_and_the_request_aborted(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    assert_planted_slot_aborts(server, keys, PROMPT_LEN, NEW_TOKENS)


def test_after_pool_pressure_every_free_page_is_zero(server: ServerProcess, keys: dict[str, str]) -> None:
    assert_free_pages_zero_after_pressure(server, keys, POOL_TOKENS, NEW_TOKENS)


def test_the_swa_sub_pool_layout_is_refused_on_torch_native(model: Path) -> None:
    """SGLang's own launcher with the tenant cache and without the launcher's flag: SGLang builds its SWA sub-pool
    layout on its CPU default backend, and the tenant cache factory refuses it, naming the backend (the sub-pool
    server below, on Triton, is the control). (The comparison server registers sglang-iso's hooks and
    backend only when the tenant cache is required.)"""
    port = free_port()
    argv = baseline_server_argv(port, model, *SIZES, "--radix-cache-backend", "tenant")
    srv = ServerProcess(argv, port, env={envvars.REQUIRE_TENANT_CACHE.name: "1"})
    with pytest.raises(ServerStartError) as err:
        srv.start(timeout_s=240)
    srv.keep_log = False  # an expected refusal: its log tail is in the error
    srv.stop()
    assert "SWA sub-pool layout on the torch_native attention backend" in str(err.value)


SUBPOOL_FLAGS = (*SIZES, *DTYPE_FLAGS, "--attention-backend", "triton")
TRACE_TOKENS = 2
"""Output tokens per request of the differential trace (each decode step runs interpreted)."""
"""Both sub-pool servers: the Triton backend (SGLang's sliding layers translate ids there), in its interpreter."""


@pytest.fixture(scope="module")
def subpool(tmp_path_factory: pytest.TempPathFactory, model: Path, keys: dict[str, str]) -> Iterator[ServerProcess]:
    tenants = {"acme": {"cache": "private"}, "globex": {"cache": "private"}}
    path = write_tenants(tmp_path_factory.mktemp("subpool-tenants"), tenants, keys=keys).path
    port = free_port()
    argv = iso_server_argv(port, model, *SUBPOOL_FLAGS, "--tenants-file", str(path), "--iso-swa-layout", "sub-pool")
    srv = ServerProcess(argv, port, env={"TRITON_INTERPRET": "1", **plant_env()})
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def upstream_subpool(model: Path) -> Iterator[ServerProcess]:
    port = free_port()
    srv = ServerProcess(baseline_server_argv(port, model, *SUBPOOL_FLAGS), port, env={"TRITON_INTERPRET": "1"})
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


def test_the_sub_pool_layout_is_served_on_the_hybrid_tree_with_both_sub_pools_scrubbed(
    subpool: ServerProcess, keys: dict[str, str]
) -> None:
    tree = tree_state(subpool, keys["admin"])
    assert tree["impl"] == "TenantHybridCache" and tree["kv_pool"] == "SWAKVPool"
    assert tree["kv_scrub"] == "on-free" and tree["kv_owner_check"] == "on"
    assert "hybrid_swa=True" in subpool.log_text()
    prompt = random_prompt(PROMPT_LEN)
    first = generate_to_length(subpool, keys["acme"], prompt, NEW_TOKENS)
    repeat = generate_to_length(subpool, keys["acme"], prompt, NEW_TOKENS)
    assert repeat["meta_info"]["cached_tokens"] > 0  # positive control: the same tenant reuses its window
    other = generate_to_length(subpool, keys["globex"], prompt, NEW_TOKENS)
    assert other["meta_info"]["cached_tokens"] == 0  # isolation
    assert repeat["output_ids"] == first["output_ids"] == other["output_ids"]
    tree = tree_state(subpool, keys["admin"])
    assert tree["owner_violations"] == 0 and tree["owner_swa_violations"] == 0


def test_in_the_sub_pool_layout_a_planted_full_slot_and_a_planted_window_entry_abort(
    subpool: ServerProcess, keys: dict[str, str]
) -> None:
    """The rows' check (a foreign full-pool slot) and the sliding-window check (a map entry pointed at another
    owner's sliding-window page) each redirect, count and abort; acme's next request is served (control)."""
    assert_planted_slot_aborts(subpool, keys, PROMPT_LEN, TRACE_TOKENS)
    before = tree_state(subpool, keys["admin"])["owner_swa_violations"]
    assert internal_command(subpool, keys["admin"], PLANT + "swa:acme")
    status, out = post_ids(subpool, keys["acme"], random_prompt(12), TRACE_TOKENS)
    assert (status == 200 and out["meta_info"]["finish_reason"]["type"] == "abort") or 400 <= status < 500, out
    assert "isolation violation" in str(out)
    assert tree_state(subpool, keys["admin"])["owner_swa_violations"] > before
    plugin = server_info(subpool, keys["admin"])["internal_states"][0]["sglang_iso_testing"]
    assert plugin["planted_swa_redirected"] >= 1  # its sliding layers read the zero page
    served = generate_to_length(subpool, keys["acme"], random_prompt(12), TRACE_TOKENS)
    assert served["meta_info"]["finish_reason"]["type"] != "abort"  # positive control


def test_in_the_sub_pool_layout_every_free_page_of_both_sub_pools_is_zero_after_pressure(
    subpool: ServerProcess, keys: dict[str, str]
) -> None:
    assert_free_pages_zero_after_pressure(subpool, keys, POOL_TOKENS, TRACE_TOKENS)


def test_the_sub_pool_tree_matches_upstream_on_a_random_multi_tenant_trace(
    subpool: ServerProcess, upstream_subpool: ServerProcess, keys: dict[str, str]
) -> None:
    """Upstream's SWA component is the oracle of window-bounded matches: the same trace (each tenant under its own
    ``extra_key`` upstream, its key here) gives every request the same cached tokens and output tokens."""
    trace = conversation_trace(seed=11, steps=8)

    def iso(tenant: str, ids: list[int]) -> dict:
        return generate_to_length(subpool, keys[tenant], ids, TRACE_TOKENS)

    ours, theirs = run_trace(trace, iso), run_trace(trace, upstream_under_extra_key(upstream_subpool, TRACE_TOKENS))
    assert sum(1 for cached, _ in theirs if cached > 0) >= 2  # the trace reuses windows in upstream
    assert ours == theirs
