"""The transfer tag binds KV to its tenant's namespace and its bootstrap room."""

from __future__ import annotations

import secrets

from sglang_iso.identity.transfer_tag import tag_matches, transfer_tag

SECRET = secrets.token_bytes(32)


def test_same_namespace_and_room_match() -> None:
    tag = transfer_tag(SECRET, "ns-acme", 42)
    assert tag_matches(SECRET, "ns-acme", 42, tag)
    assert all(0 <= w < 2**62 for w in tag) and tag != (0, 0)


def test_other_namespace_room_or_secret_do_not_match() -> None:
    tag = transfer_tag(SECRET, "ns-acme", 42)
    assert not tag_matches(SECRET, "ns-globex", 42, tag)
    assert not tag_matches(SECRET, "ns-acme", 43, tag)
    assert not tag_matches(secrets.token_bytes(32), "ns-acme", 42, tag)
    assert not tag_matches(SECRET, "ns-acme", 42, (0, 0))  # nothing written
    assert not tag_matches(SECRET, "ns-acme", 42, tag[:1])


def test_framing_is_unambiguous() -> None:
    assert transfer_tag(SECRET, "a1", 2) != transfer_tag(SECRET, "a", 12)
    assert transfer_tag(SECRET, None, 5) == transfer_tag(SECRET, "", 5)
