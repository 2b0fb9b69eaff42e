"""Scheduler-side namespace tags: only the server's own tags resolve to a tenant namespace."""

from __future__ import annotations

import secrets

import pytest

from sglang_iso.identity.tags import NamespaceResolver, make_tag

SECRET = secrets.token_bytes(32)
NS_ID = "ab" * 32


def test_valid_tag_resolves_and_same_tag_is_stable() -> None:
    r = NamespaceResolver(SECRET)
    tag = make_tag(SECRET, "acme", NS_ID)
    assert r.resolve(tag, None) == r.resolve(tag, None) == f"t:acme:{NS_ID}"
    assert NamespaceResolver.tenant_of(r.resolve(tag, None) or "") == "acme"


def test_untagged_is_internal_not_a_violation() -> None:
    r = NamespaceResolver(SECRET)
    assert r.resolve(None, None) is None and r.resolve("", None) is None
    assert r.untagged == 2 and r.rejected_tags == 0


@pytest.mark.parametrize(
    "extra_key",
    [
        "acme",
        f"iso1.acme.{NS_ID}.{'0' * 64}",  # forged MAC
        make_tag(secrets.token_bytes(32), "acme", NS_ID),  # another server's secret
        make_tag(SECRET, "acme", NS_ID) + "lora-uuid",  # SGLang appends LoRA ids: no match, no sharing
        make_tag(SECRET, "acme", NS_ID).replace("acme", "globex"),  # tenant swapped, MAC no longer fits
    ],
)
def test_anything_else_resolves_to_no_namespace_and_is_counted(extra_key: str | None) -> None:
    r = NamespaceResolver(SECRET)
    assert r.resolve(extra_key, None) is None
    assert r.rejected_tags == 1


def test_open_mode_frames_fields_unambiguously() -> None:
    r = NamespaceResolver(None)
    assert r.mode == "open"
    assert r.resolve("a", "bc") != r.resolve("ab", "c")
    assert r.resolve(None, "") != r.resolve("", None)
    assert r.resolve("x", None) == r.resolve("x", None)
    assert not (r.resolve("shared:evil", None) or "").startswith("shared:")


def test_short_secret_refused() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        NamespaceResolver(b"short")
