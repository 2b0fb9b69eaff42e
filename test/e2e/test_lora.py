"""LoRA adapters per tenant, end to end on one real server with ``--enable-lora``.

Tenant ``acme`` may use ``acme-ft`` (loaded at start) and ``acme-ft2`` (loaded and
unloaded by the admin during the run); ``globex`` may use neither. Every
no-reuse assertion is paired with a same-tenant, same-adapter hit in the same run.
"""

from __future__ import annotations

import string
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.lora_adapter import write_tiny_adapter
from sglang_iso_testing.process import ServerProcess, request_json
from sglang_iso_testing.tenants import write_tenants_file

from .conftest import start_iso_server

pytestmark = pytest.mark.e2e

ADAPTERS = {"acme": ["acme-ft", "acme-ft2"], "globex": []}


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in (*ADAPTERS, "admin")}


@pytest.fixture(scope="module")
def adapter_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "acme-ft": write_tiny_adapter(root / "acme-ft", seed=1),
        "acme-ft2": write_tiny_adapter(root / "acme-ft2", seed=2),
    }


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str], adapter_dirs: dict[str, Path]
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("tenants")
    write_tenants_file(folder, {tenant: {"adapters": list(allowed)} for tenant, allowed in ADAPTERS.items()}, keys=keys)
    srv = start_iso_server(
        "--tenants-file", str(folder / "tenants.toml"),
        "--enable-lora", "--max-loras-per-batch", "2", "--max-lora-rank", "8",
        "--lora-target-modules", "q_proj", "v_proj",
        "--lora-paths", f"acme-ft={adapter_dirs['acme-ft']}",
    )  # fmt: skip
    try:
        srv.start()
        yield srv
    finally:
        srv.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# NOTE: every prompt starts with its own single-letter word, so no two prompts share even a first token.
_FIRST_WORDS = iter(string.ascii_letters)


def prompt() -> str:
    nonce = uuid.uuid4().hex
    return f"{next(_FIRST_WORDS)} note {nonce}: " + " ".join(f"item {i} of list {nonce[:8]}" for i in range(10))


def generate(server: ServerProcess, key: str, text: str, adapter: str | None = None) -> tuple[int, Any]:
    body: dict[str, Any] = {"text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    if adapter is not None:
        body["lora_path"] = adapter
    return server.post("/generate", body, headers=auth(key))


def ok(server: ServerProcess, key: str, text: str, adapter: str | None = None) -> tuple[str, int]:
    """(output text, cached tokens) of a request that must succeed."""
    status, out = generate(server, key, text, adapter)
    assert status == 200, out
    return out["text"], int(out["meta_info"]["cached_tokens"])


def admin(server: ServerProcess, keys: dict[str, str], path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, out = server.post(path, body, headers=auth(keys["admin"]))
    assert status == 200 and out.get("success", True), out
    return out


def acme_resident_tokens(server: ServerProcess, keys: dict[str, str]) -> int:
    status, out = server.get_with("/iso/tenants", auth(keys["admin"]))
    assert status == 200, out
    return int(out["tenants"]["acme"]["ranks"][0]["resident_tokens"])


def assert_no_violations(server: ServerProcess, keys: dict[str, str]) -> None:
    status, out = server.get_with("/iso/tenants", auth(keys["admin"]))
    assert status == 200, out
    assert out["unverified_tags"] == [0]
    for tenant in ADAPTERS:
        assert out["tenants"][tenant]["ranks"][0]["violations"] == 0, out
    status, info = request_json(server.base_url + "/get_server_info", None, headers=auth(keys["admin"]))
    assert status == 200
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    assert (tree["violations"], tree["rejected_tags"]) == (0, 0), tree


def test_same_adapter_reuses_no_adapter_does_not_and_the_adapter_is_applied(
    server: ServerProcess, keys: dict[str, str]
) -> None:
    text = prompt()
    with_adapter, first = ok(server, keys["acme"], text, "acme-ft")
    again_text, again = ok(server, keys["acme"], text, "acme-ft")
    base_text, base = ok(server, keys["acme"], text)
    base_again_text, base_again = ok(server, keys["acme"], text)
    assert first == 0
    assert again > 0  # positive control: same tenant, same adapter
    assert base == 0  # same tenant, same prompt, no adapter: never the adapter's KV
    assert base_again > 0  # the base model's own entry
    assert again_text == with_adapter and base_again_text == base_text  # greedy, deterministic
    assert with_adapter != base_text  # the adapter is really applied
    assert_no_violations(server, keys)


def test_adapter_then_base_order_also_never_shares(server: ServerProcess, keys: dict[str, str]) -> None:
    text = prompt()
    assert ok(server, keys["acme"], text)[1] == 0
    assert ok(server, keys["acme"], text, "acme-ft")[1] == 0
    assert ok(server, keys["acme"], text, "acme-ft")[1] > 0


@pytest.mark.parametrize(
    ("tenant", "adapter"),
    [("acme", "globex-private"), ("globex", "acme-ft"), ("globex", "acme-ft2")],
)
def test_adapter_not_on_the_list_is_403_naming_it(
    server: ServerProcess, keys: dict[str, str], tenant: str, adapter: str
) -> None:
    status, out = generate(server, keys[tenant], prompt(), adapter)
    assert status == 403, out
    assert out["error"]["param"] == "lora_path" and repr(adapter) in out["error"]["message"]


def test_openai_model_form_is_checked_after_sglang_resolves_it(server: ServerProcess, keys: dict[str, str]) -> None:
    body = {"model": f"{tiny_model_path()}:acme-ft", "prompt": prompt(), "max_tokens": 2}
    status, out = server.post("/v1/completions", body, headers=auth(keys["globex"]))
    assert status == 403, out
    assert "acme-ft" in str(out)
    status, out = server.post("/v1/completions", body, headers=auth(keys["acme"]))
    assert status == 200, out


def test_client_cannot_name_an_adapter_by_internal_id(server: ServerProcess, keys: dict[str, str]) -> None:
    status, out = server.post("/generate", {"text": "hi", "lora_id": "0" * 32}, headers=auth(keys["globex"]))
    assert status == 400 and out["error"]["param"] == "lora_id"


def test_load_use_unload_refused_reupload_never_reuses_old_kv(
    server: ServerProcess, keys: dict[str, str], adapter_dirs: dict[str, Path]
) -> None:
    text = prompt()
    status, out = generate(server, keys["acme"], text, "acme-ft2")
    assert status == 400 and "not loaded" in str(out), out  # allowed, but not loaded yet

    admin(server, keys, "/load_lora_adapter", {"lora_name": "acme-ft2", "lora_path": str(adapter_dirs["acme-ft2"])})
    v1_text, first = ok(server, keys["acme"], text, "acme-ft2")
    v1_again, again = ok(server, keys["acme"], text, "acme-ft2")
    assert (first, v1_again) == (0, v1_text) and again > 0
    assert v1_text != ok(server, keys["acme"], text, "acme-ft")[0]  # another adapter, other output

    resident = acme_resident_tokens(server, keys)
    admin(server, keys, "/unload_lora_adapter", {"lora_name": "acme-ft2"})
    assert acme_resident_tokens(server, keys) < resident  # the unloaded adapter's KV is released
    status, out = generate(server, keys["acme"], text, "acme-ft2")
    assert status == 400 and "not loaded" in str(out) and "acme-ft2" in str(out), out  # never served

    # Re-upload different weights under the same name and path: the old KV must not match.
    write_tiny_adapter(adapter_dirs["acme-ft2"], seed=3)
    admin(server, keys, "/load_lora_adapter", {"lora_name": "acme-ft2", "lora_path": str(adapter_dirs["acme-ft2"])})
    v2_text, v2_first = ok(server, keys["acme"], text, "acme-ft2")
    v2_again_text, v2_again = ok(server, keys["acme"], text, "acme-ft2")
    assert v2_first == 0 and v2_again > 0  # new weights, new namespace; then its own reuse
    assert v2_text != v1_text and v2_again_text == v2_text
    assert_no_violations(server, keys)


def test_batches_with_adapter_lists(server: ServerProcess, keys: dict[str, str]) -> None:
    one, two = prompt(), prompt()
    body: dict[str, Any] = {"text": [one, two], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    status, out = server.post("/generate", {**body, "lora_path": ["acme-ft", None]}, headers=auth(keys["acme"]))
    assert status == 200 and len(out) == 2, out
    status, again = server.post("/generate", {**body, "lora_path": ["acme-ft", None]}, headers=auth(keys["acme"]))
    assert status == 200 and all(o["meta_info"]["cached_tokens"] > 0 for o in again), again  # positive control
    assert [o["text"] for o in again] == [o["text"] for o in out]
    assert out[0]["text"] == ok(server, keys["acme"], one, "acme-ft")[0]  # the list applies per prompt
    assert out[1]["text"] == ok(server, keys["acme"], two)[0]
    # A list naming one adapter throughout binds it like a single request: shared with single requests.
    status, same = server.post("/generate", {**body, "lora_path": ["acme-ft", "acme-ft"]}, headers=auth(keys["acme"]))
    assert status == 200 and same[0]["meta_info"]["cached_tokens"] > 0, same
    status, out = server.post("/generate", {**body, "lora_path": [None, "acme-ft"]}, headers=auth(keys["globex"]))
    assert status == 403 and "acme-ft" in out["error"]["message"], out
    assert_no_violations(server, keys)


def test_loading_and_unloading_adapters_is_admin_only(
    server: ServerProcess, keys: dict[str, str], adapter_dirs: dict[str, Path]
) -> None:
    load = {"lora_name": "acme-ft2", "lora_path": str(adapter_dirs["acme-ft2"])}
    for path, body in (("/load_lora_adapter", load), ("/unload_lora_adapter", {"lora_name": "acme-ft"})):
        status, out = server.post(path, body, headers=auth(keys["acme"]))
        assert status == 403 and out["error"]["code"] == "admin_required", out
    assert ok(server, keys["acme"], prompt(), "acme-ft")[0]  # still loaded
