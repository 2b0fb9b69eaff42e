"""Tests for CacheIdentity, encode_identity and NamespaceKeyer."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_iso.identity import CacheIdentity, NamespaceKeyer, encode_identity

SECRET = b"k" * 32
OTHER_SECRET = b"j" * 32


def make(**overrides: object) -> CacheIdentity:
    fields: dict[str, object] = {
        "tenant_id": "acme",
        "model_fingerprint": "model-abc",
        "tokenizer_fingerprint": "tok-def",
        "adapter_id": None,
        "adapter_version": None,
        "kv_dtype": "bfloat16",
        "page_size": 1,
        "cache_salt": None,
    }
    fields.update(overrides)
    return CacheIdentity(**fields)  # type: ignore[arg-type]


tenant_ids = st.from_regex(r"[a-z0-9][a-z0-9-]{0,8}", fullmatch=True)
texts = st.text(min_size=1, max_size=6)
optional_texts = st.none() | st.text(max_size=6)
identities = st.builds(
    CacheIdentity,
    tenant_id=tenant_ids,
    model_fingerprint=texts,
    tokenizer_fingerprint=texts,
    adapter_id=optional_texts,
    adapter_version=optional_texts,
    kv_dtype=texts,
    page_size=st.integers(min_value=1, max_value=64),
    cache_salt=optional_texts,
)


# --- validation --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tenant", ["", "Acme", "-acme", "a" * 65, "acme\n", "ac me", "acme_1"])
def test_bad_tenant_id_rejected(tenant: str) -> None:
    with pytest.raises(ValueError, match="tenant_id"):
        make(tenant_id=tenant)


@pytest.mark.parametrize("tenant", ["a", "acme", "0-team-9", "a" * 64])
def test_good_tenant_id_accepted(tenant: str) -> None:
    assert make(tenant_id=tenant).tenant_id == tenant


@pytest.mark.parametrize("page_size", [0, -1, True, 1.0])
def test_bad_page_size_rejected(page_size: object) -> None:
    with pytest.raises(ValueError, match="page_size"):
        make(page_size=page_size)


@pytest.mark.parametrize("field", ["model_fingerprint", "tokenizer_fingerprint", "kv_dtype"])
def test_empty_required_field_rejected(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make(**{field: ""})


def test_identity_is_frozen() -> None:
    identity = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        identity.tenant_id = "other"  # type: ignore[misc]


# --- encoding ----------------------------------------------------------------------------------------------------


@given(identities, identities)
def test_encoding_is_injective(a: CacheIdentity, b: CacheIdentity) -> None:
    assert (encode_identity(a) == encode_identity(b)) == (a == b)


@given(identities)
def test_encoding_is_deterministic_and_tagged(a: CacheIdentity) -> None:
    encoded = encode_identity(a)
    assert encoded == encode_identity(dataclasses.replace(a))
    assert b"sglang-iso/cache-identity" in encoded


def test_field_boundary_ambiguity_resolved() -> None:
    a = make(model_fingerprint="a", tokenizer_fingerprint="bc")
    b = make(model_fingerprint="ab", tokenizer_fingerprint="c")
    keyer = NamespaceKeyer(SECRET)
    assert encode_identity(a) != encode_identity(b)
    assert keyer.namespace_id(a) != keyer.namespace_id(b)


def test_boundary_ambiguity_across_optional_fields() -> None:
    a = make(adapter_id="x", adapter_version=None)
    b = make(adapter_id=None, adapter_version="x")
    keyer = NamespaceKeyer(SECRET)
    assert keyer.namespace_id(a) != keyer.namespace_id(b)


@pytest.mark.parametrize("field", ["adapter_id", "adapter_version", "cache_salt"])
def test_none_differs_from_empty_string(field: str) -> None:
    keyer = NamespaceKeyer(SECRET)
    assert keyer.namespace_id(make(**{field: None})) != keyer.namespace_id(make(**{field: ""}))


# --- keyer -------------------------------------------------------------------------------------------------------


@given(identities, identities)
def test_namespace_ids_never_collide(a: CacheIdentity, b: CacheIdentity) -> None:
    keyer = NamespaceKeyer(SECRET)
    assert (keyer.namespace_id(a) == keyer.namespace_id(b)) == (a == b)


@given(identities)
def test_different_secret_gives_different_id(a: CacheIdentity) -> None:
    assert NamespaceKeyer(SECRET).namespace_id(a) != NamespaceKeyer(OTHER_SECRET).namespace_id(a)


@given(identities)
def test_verify_accepts_own_tag(a: CacheIdentity) -> None:
    keyer = NamespaceKeyer(SECRET)
    tag = keyer.namespace_id(a)
    assert len(tag) == 64
    assert keyer.verify(a, tag)


def test_forged_tags_fail_verify() -> None:
    keyer = NamespaceKeyer(SECRET)
    identity = make()
    real = keyer.namespace_id(identity)
    forged = [
        "",
        "0" * 64,
        real[:-1],
        real + "0",
        real.upper(),
        real[:-1] + ("0" if real[-1] != "0" else "1"),
        NamespaceKeyer(OTHER_SECRET).namespace_id(identity),
        keyer.namespace_id(make(tenant_id="other")),
        "\u00e9" * 64,
        "\ud800",
    ]
    assert keyer.verify(identity, real)  # positive control
    for tag in forged:
        assert not keyer.verify(identity, tag), tag
    assert not keyer.verify(identity, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("secret", [b"", b"x" * 31, "x" * 40])
def test_short_or_non_bytes_secret_rejected(secret: object) -> None:
    with pytest.raises(ValueError, match="secret"):
        NamespaceKeyer(secret)  # type: ignore[arg-type]


def test_repr_hides_secret(caplog: pytest.LogCaptureFixture) -> None:
    keyer = NamespaceKeyer(b"super-secret-value-0123456789abcdef")
    assert "super-secret" not in repr(keyer)
    logging.getLogger(__name__).warning("%r", keyer)
    assert "super-secret" not in caplog.text
