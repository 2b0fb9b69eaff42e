"""Tests for key minting/hashing, KeyIndex lookups and Authorization header parsing."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_iso.tenancy import KeyIndex, Principal, TenantsConfig, key_sha256, load_tenants_file, new_api_key
from sglang_iso.tenancy import keys as keys_module
from sglang_iso.tenancy.config import Tenant

from .conftest import ACME_KEY, ADMIN_KEY, GLOBEX_KEY, VALID_BODY, WriteTenants


@pytest.fixture
def index(write_tenants: WriteTenants) -> KeyIndex:
    return KeyIndex(load_tenants_file(write_tenants(VALID_BODY)))


# --- minting and hashing -----------------------------------------------------------------------------------------


def test_new_api_key_format_and_uniqueness() -> None:
    minted = {new_api_key() for _ in range(50)}
    assert len(minted) == 50
    for key in minted:
        assert re.fullmatch(r"sk-iso-[A-Za-z0-9_-]{43}", key), key


def test_key_sha256_is_plain_sha256_hex() -> None:
    assert key_sha256("sk-iso-abc") == hashlib.sha256(b"sk-iso-abc").hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", key_sha256(new_api_key()))


@pytest.mark.parametrize("bad", ["", " sk-iso-a", "sk-iso-a\n", "sk iso", "sk-iso-\u00e9"])
def test_key_sha256_rejects_unpresentable_keys(bad: str) -> None:
    with pytest.raises(ValueError, match="key"):
        key_sha256(bad)


def test_new_key_hash_lookup_round_trip(write_tenants: WriteTenants) -> None:
    key = new_api_key()
    body = f'\n[[tenants]]\nid = "fresh"\nkey_sha256 = ["{key_sha256(key)}"]\n'
    index = KeyIndex(load_tenants_file(write_tenants(body)))
    assert index.lookup(key) == Principal.for_tenant("fresh")
    assert index.lookup(key[:-1]) is None
    assert index.lookup(key + "x") is None


# --- lookup ------------------------------------------------------------------------------------------------------


def test_tenant_and_admin_principals(index: KeyIndex) -> None:
    acme = index.lookup(ACME_KEY)
    assert acme == Principal("tenant", "acme")
    assert acme is not None and not acme.is_admin
    assert index.lookup(GLOBEX_KEY) == Principal.for_tenant("globex")
    admin = index.lookup(ADMIN_KEY)
    assert admin == Principal.for_admin()
    assert admin is not None and admin.is_admin and admin.tenant_id is None
    assert len(index) == 4


@pytest.mark.parametrize(
    "presented", ["", "sk-iso-unknown", ACME_KEY.upper(), "x" * 5000, "sk iso", "\u00e9", "0" * 64]
)
def test_unknown_or_malformed_key_is_none(index: KeyIndex, presented: str) -> None:
    assert index.lookup(presented) is None


def test_hash_is_not_a_key(index: KeyIndex) -> None:
    # Presenting the stored hash itself must not authenticate.
    assert index.lookup(key_sha256(ACME_KEY)) is None


def test_non_string_is_none(index: KeyIndex) -> None:
    assert index.lookup(None) is None  # type: ignore[arg-type]
    assert index.lookup(b"sk-iso-acme-test-key") is None  # type: ignore[arg-type]


def test_ten_thousand_tenants_each_key_finds_its_own_tenant(tmp_path: Path) -> None:
    from sglang_iso.tenancy.config import load_tenants_file
    from sglang_iso_testing.tenants import write_tenants_file

    made = write_tenants_file(tmp_path, [f"t{i}" for i in range(10_000)])
    index = KeyIndex(load_tenants_file(made.path))
    assert len(index) == 10_001  # every tenant's key and the admin key
    for tenant in ("t0", "t4999", "t9999"):
        principal = index.lookup(made.keys[tenant])
        assert principal is not None and principal.tenant_id == tenant, (tenant, principal)
    admin = index.lookup(made.keys["admin"])
    assert admin is not None and admin.kind == "admin"
    assert index.lookup("sk-iso-unknown") is None and index.lookup(key_sha256(made.keys["t1"])) is None


def test_duplicate_hash_in_handmade_config_is_refused(tmp_path: Path) -> None:
    digest = key_sha256(ACME_KEY)
    config = TenantsConfig(
        secret=b"s" * 32,
        admin_key_hashes=frozenset({digest}),
        tenants={"acme": Tenant("acme", frozenset({digest}), None, "private", None)},
        shared_prefixes=(),
        source=tmp_path / "t.toml",
    )
    with pytest.raises(ValueError, match="key_sha256"):
        KeyIndex(config)


@pytest.mark.parametrize(
    ("kind", "tenant_id"), [("tenant", None), ("tenant", "Bad"), ("admin", "acme"), ("root", None)]
)
def test_principal_validation(kind: str, tenant_id: str | None) -> None:
    with pytest.raises(ValueError):
        Principal(kind, tenant_id)  # type: ignore[arg-type]


# --- Authorization header ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer sk-iso-abc", "sk-iso-abc"),
        ("bearer sk-iso-abc", "sk-iso-abc"),
        ("BEARER sk-iso-abc", "sk-iso-abc"),
        ("  Bearer   sk-iso-abc  ", "sk-iso-abc"),
        ("Bearer\tsk-iso-abc", "sk-iso-abc"),
        (None, None),
        ("", None),
        ("   ", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Bearer    ", None),
        ("Basic c2staXNvLWFiYw==", None),
        ("sk-iso-abc", None),
        ("Bearersk-iso-abc", None),
        ("Bearer sk-iso-abc extra", None),
        ("Bearer sk-iso-\u00e9", None),
        ("Bearer sk-iso\x00abc", None),
        ("Token sk-iso-abc", None),
    ],
)
def test_parse_bearer(header: str | None, expected: str | None) -> None:
    assert keys_module.parse_bearer(header) == expected


@given(st.text(max_size=40))
def test_parse_bearer_never_returns_whitespace_or_empty(header: str) -> None:
    token = keys_module.parse_bearer(header)
    assert token is None or (token and token == token.strip() and not any(c.isspace() for c in token))


@given(st.text(max_size=40) | st.text(st.characters(max_codepoint=0x2FF), max_size=40))
def test_a_key_character_is_exactly_printable_ascii_other_than_space(value: str) -> None:
    """The key-character check (in C) admits exactly 0x21-0x7e, char by char; a real key passes."""
    assert keys_module._is_token(value) == all("\x21" <= c <= "\x7e" for c in value), ascii(value)
    assert keys_module._is_token(ACME_KEY) and not keys_module._is_token(ACME_KEY + "\x7f")


def test_bearer_to_principal(index: KeyIndex) -> None:
    token = keys_module.parse_bearer(f"bearer  {ACME_KEY} ")
    assert token is not None
    assert index.lookup(token) == Principal.for_tenant("acme")
