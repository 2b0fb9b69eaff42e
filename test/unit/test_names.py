"""One set of name rules: what the tenants file (and ``check-config``) accepts, the tree and the tags accept too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_iso.cache import TenantRadixTree
from sglang_iso.identity.cache_identity import CacheIdentity
from sglang_iso.identity.tags import NamespaceResolver, make_tag
from sglang_iso.names import (
    TENANT_ID_PATTERN,
    is_shared_prefix_key,
    is_valid_shared_prefix_name,
    is_valid_tenant_id,
    shared_prefix_key,
)
from sglang_iso.tenancy.operator_commands import check_config_main

from .tenancy.conftest import ACME_HASH, GLOBEX_HASH, HEADER

SECRET = b"s" * 32
GOOD_SHARED = ["p", "Support-Bot_v1.2", "a" * 64, "A" * 64, "0.x"]
BAD_SHARED = ["", "a" * 65, "a" * 100, "-p", ".p", "p q", "p:q", "p/q", "\u212a", "é"]


def _file(tmp_path: Path, body: str) -> Path:
    (tmp_path / "secret.key").write_text(os.urandom(32).hex())
    path = tmp_path / "tenants.toml"
    path.write_text(HEADER + body)
    return path


def _tenant(tid: str, key_hash: str) -> str:
    return f'\n[[tenants]]\nid = "{tid}"\nkey_sha256 = ["{key_hash}"]\n'


def _prefix(name: str) -> str:
    return f'\n[[shared_prefixes]]\nname = "{name}"\ntext = "x"\ntenants = ["*"]\n'


@pytest.mark.parametrize("name", GOOD_SHARED)
def test_a_name_the_loader_accepts_the_tree_accepts(name: str) -> None:
    assert is_valid_shared_prefix_name(name)
    tree = TenantRadixTree(1, lambda _slots: None)
    assert tree.declare_shared(shared_prefix_key(name), [1, 2], "*", scope="m") == "shared:" + name.lower()


@pytest.mark.parametrize("name", BAD_SHARED)
def test_bad_shared_names_are_refused_by_both(name: str) -> None:
    assert not is_valid_shared_prefix_name(name)
    tree = TenantRadixTree(1, lambda _slots: None)
    with pytest.raises(ValueError, match="shared name"):
        tree.declare_shared(name, [1, 2], "*", scope="m")


def test_the_tree_takes_only_the_key_form() -> None:
    assert is_shared_prefix_key("bot") and not is_shared_prefix_key("Bot")
    with pytest.raises(ValueError, match="shared name"):
        TenantRadixTree(1, lambda _slots: None).declare_shared("Bot", [1], "*", scope="m")


@pytest.mark.parametrize("tid", ["acme", "a", "a-1", "a" * 64])
def test_tenant_ids_pass_identity_and_tags(tid: str) -> None:
    assert is_valid_tenant_id(tid)
    _identity(tid)
    resolver = NamespaceResolver(SECRET)
    assert resolver.resolve(make_tag(SECRET, tid, "0" * 64), None) == f"t:{tid}:{'0' * 64}"


@pytest.mark.parametrize("tid", ["Foo", "", "a" * 65, "a.b", "a:b", "-a", "a_b"])
def test_bad_tenant_ids_are_refused(tid: str) -> None:
    assert not is_valid_tenant_id(tid)
    assert TENANT_ID_PATTERN.fullmatch(tid) is None
    with pytest.raises(ValueError):
        _identity(tid)


def _identity(tid: str) -> CacheIdentity:
    return CacheIdentity(tid, "model", "tokenizer", None, None, "float32", 1)


def _check(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    rc = check_config_main([str(path)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_check_config_refuses_shared_names_equal_but_for_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out = _check(capsys, _file(tmp_path, _tenant("acme", ACME_HASH) + _prefix("Foo") + _prefix("foo")))
    assert rc == 1
    assert "shared_prefixes[1].name" in out and "duplicate shared prefix name 'foo'" in out and "case" in out
    rc, out = _check(capsys, _file(tmp_path, _tenant("acme", ACME_HASH) + _prefix("Foo") + _prefix("bar")))
    assert rc == 0, out  # positive control: two different names load


def test_check_config_refuses_a_100_character_shared_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(capsys, _file(tmp_path, _tenant("acme", ACME_HASH) + _prefix("p" * 100)))
    assert rc == 1 and "shared_prefixes[0].name" in out and "invalid name" in out
    rc, out = _check(capsys, _file(tmp_path, _tenant("acme", ACME_HASH) + _prefix("p" * 64)))
    assert rc == 0, out


def test_check_config_refuses_tenant_ids_by_the_same_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _check(capsys, _file(tmp_path, _tenant("Foo", ACME_HASH) + _tenant("foo", GLOBEX_HASH)))
    assert rc == 1 and "tenants[0].id" in out and "invalid tenant id 'Foo'" in out
    rc, out = _check(capsys, _file(tmp_path, _tenant("a" * 100, ACME_HASH)))
    assert rc == 1 and "tenants[0].id" in out
