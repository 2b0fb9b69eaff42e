"""The namespace tagger remembers tags per (tenant, salt, adapter): what it hands back is what it would compute."""

from __future__ import annotations

import secrets
from pathlib import Path

from sglang_iso.server import tagging
from sglang_iso.server.tagging import NamespaceTagger
from sglang_iso.tenancy.config import Tenant, TenantsConfig


def tagger(secret: bytes) -> NamespaceTagger:
    tenants = {t: Tenant(t, frozenset({str(i) * 64}), None, "private", None, frozenset()) for i, t in enumerate("ab")}
    config = TenantsConfig(secret, frozenset(), tenants, (), Path("t.toml"))
    return NamespaceTagger(config, model_fingerprint="m", tokenizer_fingerprint="t", kv_dtype="auto", page_size=1)


def test_a_remembered_tag_is_the_computed_one_and_tenants_salts_and_adapters_stay_apart() -> None:
    secret = secrets.token_bytes(32)
    first, fresh = tagger(secret), tagger(secret)
    asks = [("a", None, None), ("a", "s1", None), ("a", None, "lora"), ("b", None, None), ("b", "s1", None)]
    tags = [first.tag(t, cache_salt=s, adapter=ad, adapter_version="h" if ad else None) for t, s, ad in asks]
    again = [first.tag(t, cache_salt=s, adapter=ad, adapter_version="h" if ad else None) for t, s, ad in asks]
    computed = [fresh._compute(t, s, ad, "h" if ad else None) for t, s, ad in asks]
    assert tags == again == computed  # positive control: same ask, same tag, from memory or computed
    assert len(set(tags)) == len(asks)  # every tenant, salt and adapter its own namespace
    assert first.tag("nobody", cache_salt=None, adapter=None) is None


def test_memory_is_bounded_and_a_new_tagger_does_not_inherit_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A client picks its salt freely: the memory never holds more than its bound, nor any long salt (computed each
    time, with the same tag). A reload builds a new tagger (a new secret here), whose tags are its own, not the old
    tagger's remembered ones."""
    monkeypatch.setattr(tagging, "_TAG_CACHE_SIZE", 8)
    secret = secrets.token_bytes(32)
    old = tagger(secret)
    for i in range(50):
        old.tag("a", cache_salt=f"salt{i}", adapter=None)
    assert old._tag.cache_info().currsize == 8
    long_salt = "x" * (tagging._TAG_CACHE_MAX_SALT + 1)
    lookups = old._tag.cache_info().hits + old._tag.cache_info().misses
    assert old.tag("a", cache_salt=long_salt, adapter=None) == old._compute("a", long_salt, None, None)
    assert old._tag.cache_info().hits + old._tag.cache_info().misses == lookups  # a long salt never enters it
    before = old.tag("a", cache_salt=None, adapter=None)
    assert old.tag("a", cache_salt=None, adapter=None) == before == tagger(secret)._compute("a", None, None, None)
    assert tagger(secrets.token_bytes(32)).tag("a", cache_salt=None, adapter=None) != before
