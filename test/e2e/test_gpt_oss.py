"""gpt-oss (sliding-window hybrid with attention sinks, MoE) under the guarantees, end to end on CPU.

A tiny gpt-oss-shaped model written by the test (``sglang_iso_testing.tiny_gpt_oss``: sliding and full attention in
turn, a window of 8 tokens, per-head sinks, four experts, seeded weights). Its sinks need the Triton attention
backend (run here in Triton's interpreter); the launcher's ``--disable-hybrid-swa-memory`` keeps every layer's KV in
one pool. Served with a tenants file, the owner check on and the test plugin loaded; with their positive controls in
the same run: the same tenant's repeat of a prompt three windows long hits the cache while another tenant misses,
and every output equals the no-cache one; a foreign slot planted into a request's row is redirected to the zero page
and the request aborted; after pool pressure every free page is zero.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sglang_iso_testing.plant import plant_env
from sglang_iso_testing.process import ServerProcess, free_port, iso_server_argv
from sglang_iso_testing.tiny_gpt_oss import SERVE_FLAGS, WINDOW, write_tiny_gpt_oss

from .helpers import (
    TENANTS,
    assert_free_pages_zero_after_pressure,
    assert_planted_slot_aborts,
    generate_to_length,
    random_prompt,
    server_info,
    tree_state,
    write_tenants_file,
)

pytestmark = pytest.mark.e2e

PROMPT_LEN = 3 * WINDOW
NEW_TOKENS = 6
POOL_TOKENS = 1024
SIZES = ("--max-total-tokens", str(POOL_TOKENS), "--max-running-requests", "4")


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    from sglang_iso.tenancy.keys import new_api_key

    return {name: new_api_key() for name in (*TENANTS, "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    model = write_tiny_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss"))
    tenants = write_tenants_file(tmp_path_factory.mktemp("tenants"), keys)
    port = free_port()
    argv = iso_server_argv(port, model, *SIZES, *SERVE_FLAGS, "--tenants-file", str(tenants))
    srv = ServerProcess(argv, port, env={**plant_env(), "TRITON_INTERPRET": "1"})
    try:
        srv.start(timeout_s=600)
        yield srv
    finally:
        srv.stop()


def test_served_in_the_one_pool_layout_on_triton(server: ServerProcess, keys: dict[str, str]) -> None:
    info = server_info(server, keys["admin"])
    assert info["disable_hybrid_swa_memory"] is True and info["attention_backend"] == "triton"
    tree = tree_state(server, keys["admin"])
    assert tree["kv_pool"] == "MHATokenToKVPool"
    assert tree["kv_scrub"] == "on-free" and tree["kv_owner_check"] == "on"


def test_same_tenant_hits_other_tenant_misses_and_outputs_equal_the_uncached_one(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    prompt = random_prompt(PROMPT_LEN)
    first = generate_to_length(server, keys["acme"], prompt, NEW_TOKENS)
    assert first["meta_info"]["cached_tokens"] == 0
    repeat = generate_to_length(server, keys["acme"], prompt, NEW_TOKENS)  # positive control
    assert repeat["meta_info"]["cached_tokens"] == PROMPT_LEN - 1
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


def test_the_launcher_refuses_it_on_torch_native_naming_the_backend_that_serves_it(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """On CPU the launcher's default backend is torch_native, which takes no sinks: refused before SGLang starts (it
    would fail at the first request); the same command with the Triton backend is planned (control)."""
    from sglang_iso.launch_server import main

    model = str(write_tiny_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss-refused")))
    assert main(["--model-path", model, "--iso-dry-run"]) == 2
    err = capsys.readouterr().err
    assert "attention sinks (gpt-oss) on the torch_native attention backend" in err
    assert "--attention-backend triton" in err
    assert main(["--model-path", model, "--attention-backend", "triton", "--iso-dry-run"]) == 0
