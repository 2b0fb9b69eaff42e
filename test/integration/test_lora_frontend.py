"""Front-end LoRA logic without a server: allow-list on resolved requests, adapter versions, load/unload hooks."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_iso.integration import lora
from sglang_iso.integration.front import state
from sglang_iso.server.adapters import AdapterVersions
from sglang_iso.server.tagging import NamespaceTagger
from sglang_iso.tenancy.config import Tenant, TenantsConfig


@pytest.fixture(autouse=True)
def front_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """A front-end state of its own per test: the adapter versions the hooks record into and resolve reads."""
    monkeypatch.setattr(state, "_CURRENT", SimpleNamespace(adapter_versions=AdapterVersions()))


def resolve(manager: Any, allowed: Any, lora_path: object) -> lora.AdapterIdentity | None:
    front = state.current()
    assert front is not None
    return lora.resolve(manager, allowed, lora_path, front.adapter_versions)


def adapter_dir(root: Path, name: str, payload: bytes) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(payload)
    return folder


def manager(refs: dict[str, Any], enable_lora: bool = True) -> SimpleNamespace:
    sent: list[dict[str, Any]] = []

    async def set_internal_state(req: Any) -> list[bool]:
        sent.append(dict(req.server_args))
        return [True]

    return SimpleNamespace(
        enable_lora=enable_lora, lora_ref_cache=refs, set_internal_state=set_internal_state, sent=sent
    )


def ref(name: str, path: Path | str | None, lora_id: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        lora_name=name, lora_path=str(path) if path else None, lora_id=lora_id or secrets.token_hex(16)
    )


def test_base_model_and_allowed_adapter(tmp_path: Path) -> None:
    refs = {"a": ref("a", adapter_dir(tmp_path, "a", b"1"))}
    m = manager(refs)
    assert resolve(m, {"a"}, None) is None
    identity = resolve(m, {"a"}, "a")
    assert identity is not None and identity.name == "a" and len(identity.version) == 64
    assert resolve(m, {"a"}, ["a", "a"]) == identity


@pytest.mark.parametrize(("lora_path", "status"), [("b", 403), (["a", "b"], 403), (5, 400), (["a", 5], 400)])
def test_refused_with_status(tmp_path: Path, lora_path: object, status: int) -> None:
    m = manager({"a": ref("a", adapter_dir(tmp_path, "a", b"1")), "b": ref("b", adapter_dir(tmp_path, "b", b"2"))})
    with pytest.raises(lora.AdapterForbidden) as info:
        resolve(m, {"a"}, lora_path)
    assert info.value.status_code == status and "lora_path" in str(info.value.detail)


def test_allowed_but_not_loaded_is_refused(tmp_path: Path) -> None:
    with pytest.raises(lora.AdapterNotLoaded, match="'gone' is not loaded") as info:
        resolve(manager({}), {"gone"}, "gone")
    assert info.value.status_code == 400


def test_mixed_list_binds_no_adapter_but_is_still_checked(tmp_path: Path) -> None:
    m = manager({"a": ref("a", adapter_dir(tmp_path, "a", b"1")), "b": ref("b", adapter_dir(tmp_path, "b", b"2"))})
    assert resolve(m, {"a", "b"}, ["a", "b"]) is None
    assert resolve(m, {"a"}, ["a", None]) is None


def test_lora_off_leaves_the_refusal_to_sglang() -> None:
    assert resolve(manager({}, enable_lora=False), {"a"}, "a") is None


def test_unhashable_adapter_gets_a_per_load_version() -> None:
    m = manager({"t": ref("t", "not/a/dir", "f" * 32)})
    identity = resolve(m, {"t"}, "t")
    assert identity is not None and identity.version == "unhashed:" + "f" * 32


def test_load_records_content_and_unload_forgets_the_name(tmp_path: Path) -> None:
    folder = adapter_dir(tmp_path, "x", b"v1")
    refs: dict[str, Any] = {}
    m = manager(refs)
    loaded = ref("x", folder)

    async def load(_manager: Any, obj: Any) -> Any:
        refs[obj.lora_name] = loaded
        return SimpleNamespace(success=True)

    async def unload(_manager: Any, obj: Any) -> Any:
        return SimpleNamespace(success=True)

    asyncio.run(lora.after_load(load, m, SimpleNamespace(lora_name="x", lora_path=str(folder))))
    v1 = resolve(m, {"x"}, "x")
    asyncio.run(lora.after_unload(unload, m, SimpleNamespace(lora_name="x")))
    assert "x" not in refs
    assert m.sent == [{f"sglang_iso.flush_adapter:{loaded.lora_id}": 1}]  # its KV is released
    with pytest.raises(lora.AdapterNotLoaded):
        resolve(m, {"x"}, "x")
    (folder / "adapter_model.safetensors").write_bytes(b"v2")  # re-upload under the same name
    loaded = ref("x", folder)
    asyncio.run(lora.after_load(load, m, SimpleNamespace(lora_name="x", lora_path=str(folder))))
    v2 = resolve(m, {"x"}, "x")
    assert v1 is not None and v2 is not None and v1.version != v2.version


def test_files_changing_during_a_load_get_no_content_identity(tmp_path: Path) -> None:
    folder = adapter_dir(tmp_path, "y", b"before")
    refs: dict[str, Any] = {}
    loaded = ref("y", folder)

    async def load(_manager: Any, obj: Any) -> Any:
        (folder / "adapter_model.safetensors").write_bytes(b"after")
        refs[obj.lora_name] = loaded
        return SimpleNamespace(success=True)

    asyncio.run(lora.after_load(load, manager(refs), SimpleNamespace(lora_name="y", lora_path=str(folder))))
    identity = resolve(manager(refs), {"y"}, "y")
    assert identity is not None and identity.version == f"unhashed:{loaded.lora_id}"


def test_tags_bind_the_adapter_and_its_content() -> None:
    config = TenantsConfig(
        secrets.token_bytes(32),
        frozenset(),
        {"acme": Tenant("acme", frozenset({"0" * 64}), None, "private", None, frozenset({"a"}))},
        (),
        Path("t.toml"),
    )
    tagger = NamespaceTagger(config, model_fingerprint="m", tokenizer_fingerprint="t", kv_dtype="auto", page_size=1)
    base = tagger.tag("acme", cache_salt=None, adapter=None)
    v1 = tagger.tag("acme", cache_salt=None, adapter="a", adapter_version="h1")
    assert v1 == tagger.tag("acme", cache_salt=None, adapter="a", adapter_version="h1")
    assert len({base, v1, tagger.tag("acme", cache_salt=None, adapter="a", adapter_version="h2")}) == 3
    assert tagger.tag("acme", cache_salt=None, adapter="b", adapter_version="h1") != v1


def test_adapter_sent_as_tensors_is_identified_by_its_content() -> None:
    refs: dict[str, Any] = {}
    m = manager(refs)

    def load_with(tensors: list[bytes]) -> str:
        loaded = ref("z", "__tensor__")

        async def load(_manager: Any, obj: Any) -> Any:
            refs[obj.lora_name] = loaded
            return SimpleNamespace(success=True)

        obj = SimpleNamespace(lora_name="z", config_dict={"r": 8}, serialized_named_tensors=tensors)
        asyncio.run(lora.after_tensor_load(load, m, obj))
        identity = resolve(m, {"z"}, "z")
        assert identity is not None
        return identity.version

    first = load_with([b"w1"])
    assert len(first) == 64 and first == load_with([b"w1"])
    assert load_with([b"w2"]) != first
    assert load_with([b"w", b"1"]) != first  # framing: the split between copies counts
