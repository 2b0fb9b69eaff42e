"""Scheduler-side namespace tags: only the server's own tags resolve to a tenant namespace."""

from __future__ import annotations

import secrets

import pytest

from sglang_iso.identity.tags import Namespace, NamespaceResolver, make_tag, tenant_of

SECRET = secrets.token_bytes(32)
NS_ID = "ab" * 32


def test_valid_tag_resolves_and_same_tag_is_stable() -> None:
    r = NamespaceResolver(SECRET)
    tag = make_tag(SECRET, "acme", NS_ID)
    assert r.resolve(tag, None) == r.resolve(tag, None) == f"t:acme:{NS_ID}"
    assert tenant_of(r.resolve(tag, None)) == "acme"
    ns = r.resolve_namespace(tag, None)
    assert ns is not None and ns.kind == "tenant" and ns.tenant == "acme" and ns.adapter is None
    assert Namespace.parse(ns.key) == ns


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
        make_tag(SECRET, "acme", NS_ID) + "lora-uuid",  # not a LoRA id SGLang would append
        make_tag(SECRET, "acme", NS_ID) + "A" * 32,  # LoRA ids are lowercase hex
        make_tag(SECRET, "acme", NS_ID) + "0" * 33,  # one char too long
        make_tag(SECRET, "acme", NS_ID)[:-1] + "0" * 32,  # suffix cannot repair a broken MAC
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


def test_lora_suffix_verifies_and_narrows_the_namespace() -> None:
    r = NamespaceResolver(SECRET)
    tag = make_tag(SECRET, "acme", NS_ID)
    base = r.resolve(tag, None)
    one, two = r.resolve(tag + "a" * 32, None), r.resolve(tag + "b" * 32, None)
    assert base is not None and one is not None and two is not None
    assert len({base, one, two}) == 3  # each adapter load is its own namespace, never the base model's
    assert r.resolve(tag + "a" * 32, None) == one  # same adapter load: shared
    assert [tenant_of(ns) for ns in (base, one, two)] == ["acme"] * 3
    typed = [r.resolve_namespace(tag + suffix, None) for suffix in ("", "a" * 32)]
    assert [(n.key, n.tenant, n.adapter) for n in typed if n is not None] == [
        (base, "acme", None),
        (one, "acme", "a" * 32),
    ]
    assert [Namespace.parse(k) for k in (base, one)] == typed  # a key reads back as the namespace it was made from
    assert Namespace.parse("shared:sys") == Namespace.shared_prefix("sys") and Namespace.parse("x:y") is None
    assert r.rejected_tags == 0 and r.untagged == 0


def test_bare_lora_id_is_untagged_not_a_violation() -> None:
    r = NamespaceResolver(SECRET)
    assert r.resolve("c" * 32, None) is None
    assert (r.untagged, r.rejected_tags) == (1, 0)


def test_verified_tags_are_remembered_forged_ones_are_checked_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The resolver keeps verified tags (bounded); a forged tag never enters and is counted on every lookup."""
    from sglang_iso.identity import tags

    monkeypatch.setattr(tags, "VERIFIED_TAGS", 4)
    r = NamespaceResolver(SECRET)
    good = make_tag(SECRET, "acme", NS_ID)
    forged = good[:-1] + ("0" if good[-1] != "0" else "1")
    assert r.resolve(good, None) == f"t:acme:{NS_ID}"  # positive control, then from memory
    assert r.resolve(good, None) == f"t:acme:{NS_ID}"
    for n in range(3):
        assert r.resolve(forged, None) is None
        assert r.rejected_tags == n + 1
    others = [make_tag(SECRET, "acme", f"{i:064x}") for i in range(10)]
    assert [r.resolve(t, None) for t in others] == [f"t:acme:{i:064x}" for i in range(10)]
    assert len(r._verified) == 4 and forged not in r._verified
    assert r.resolve(good, None) == f"t:acme:{NS_ID}"  # dropped from memory, verified again
    assert r.rejected_tags == 3
