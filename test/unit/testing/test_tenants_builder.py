"""The harness's tenants-file builder writes what the server's own loader accepts, with the keys it returns."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso.tenancy.config import load_tenants_file
from sglang_iso.tenancy.keys import key_sha256
from sglang_iso_testing.tenants import write_tenants_file


def test_the_loader_reads_back_every_field_and_key(tmp_path: Path) -> None:
    message = {"role": "system", "content": 'Say "hi" \\ then \u00e9'}  # quotes, a backslash, non-ASCII
    prefix = {"name": "bot", "messages": [message], "tenants": ["acme"]}
    made = write_tenants_file(
        tmp_path,
        {"acme": {"cache": "private", "quota_tokens": 64, "kv_share": 0.25}, "hooli": {"cache": "group:hooli"}},
        keys={"acme": "sk-iso-given"},
        router=True,
        shared_prefixes=[prefix],
        default_kv_share=1.0,
    )
    config = load_tenants_file(made.path)
    assert made.keys["acme"] == "sk-iso-given" and {"hooli", "admin", "router"} <= made.keys.keys()
    assert config.secret == made.secret and len(made.secret) == 32
    assert config.admin_key_hashes == {key_sha256(made.keys["admin"])}
    assert config.router_key_hashes == {key_sha256(made.keys["router"])}
    acme, hooli = config.tenants["acme"], config.tenants["hooli"]
    assert acme.key_hashes == {key_sha256("sk-iso-given")} and hooli.key_hashes == {key_sha256(made.keys["hooli"])}
    assert (acme.quota_tokens, acme.kv_share, hooli.group) == (64, 0.25, "hooli")
    assert config.default_kv_share == 1.0
    assert config.shared_prefixes[0].name == "bot"


def test_ids_alone_and_no_admin(tmp_path: Path) -> None:
    made = write_tenants_file(tmp_path, ["alpha", "beta"], admin=False)
    config = load_tenants_file(made.path)
    assert list(config.tenants) == ["alpha", "beta"] and config.admin_key_hashes == frozenset()
    assert "admin" not in made.keys


def test_a_value_toml_cannot_hold_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"acme\.quota_tokens"):
        write_tenants_file(tmp_path, {"acme": {"quota_tokens": float("nan")}})


def test_a_tenant_may_list_several_keys(tmp_path: Path) -> None:
    made = write_tenants_file(tmp_path, ["acme", "beta"], keys={"acme": ["sk-iso-old", "sk-iso-new"]})
    config = load_tenants_file(made.path)
    assert config.tenants["acme"].key_hashes == {key_sha256("sk-iso-old"), key_sha256("sk-iso-new")}
    assert made.keys["acme"] == "sk-iso-old" and config.tenants["beta"].key_hashes == {key_sha256(made.keys["beta"])}
