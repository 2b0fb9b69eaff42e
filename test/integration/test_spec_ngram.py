"""Per-namespace NGRAM corpora on the real SGLang corpus, without a server.

Positive control in every test: the namespace that inserted a text gets drafts from it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sglang_iso.identity.tags import NamespaceResolver, make_tag
from sglang_iso.integration.spec_ngram import NamespacedNgramCorpus, bind_batch

N = 4
SECRET = b"s" * 32
TEXT = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def _corpus(max_namespaces: int = 8, off: frozenset[str] = frozenset()) -> NamespacedNgramCorpus:
    kwargs = {"min_bfs_breadth": 1, "max_bfs_breadth": 2, "match_type": "BFS", "max_trie_depth": 8,
              "draft_token_num": N}  # fmt: skip
    return NamespacedNgramCorpus(
        NamespaceResolver(SECRET), kwargs, capacity=4096, max_namespaces=max_namespaces, no_retention=off
    )


def _req(rid: str, tenant: str | None) -> SimpleNamespace:
    key = make_tag(SECRET, tenant, "0" * 64) if tenant else None
    return SimpleNamespace(rid=rid, extra_key=key, cache_salt=None)


def _put(corpus: NamespacedNgramCorpus, req: SimpleNamespace, tokens: list[int]) -> None:
    corpus.bind([req])
    corpus.batch_put([tokens])
    corpus.unbind()
    corpus.synchronize()


def _drafts(corpus: NamespacedNgramCorpus, reqs: list[SimpleNamespace], prefix: list[int]) -> list[list[int]]:
    corpus.bind(reqs)
    tokens, mask = corpus.batch_get([r.rid for r in reqs], [prefix] * len(reqs), [len(prefix)] * len(reqs))
    corpus.unbind()
    assert mask.shape == (len(reqs) * N * N,)
    return [list(tokens[i * N : (i + 1) * N]) for i in range(len(reqs))]


def _hits(draft: list[int]) -> int:
    return sum(t in TEXT[3:] for t in draft[1:])


def test_only_the_inserting_namespace_drafts_its_text() -> None:
    corpus = _corpus()
    _put(corpus, _req("a0", "acme"), TEXT)
    a, b, anon = _drafts(corpus, [_req("a1", "acme"), _req("b1", "beta"), _req("x1", None)], TEXT[:3])
    assert _hits(a) >= 2  # positive control: acme's own text drafts acme's continuation
    assert _hits(b) == 0 and _hits(anon) == 0
    assert corpus.namespaces() == [
        NamespaceResolver(SECRET).resolve(_req("a", "acme").extra_key, None),
        *[NamespaceResolver(SECRET).resolve(_req("b", "beta").extra_key, None)],
    ]


def test_untagged_text_goes_nowhere() -> None:
    corpus = _corpus()
    _put(corpus, _req("x0", None), TEXT)
    (anon,) = _drafts(corpus, [_req("x1", None)], TEXT[:3])
    _put(corpus, _req("a0", "acme"), TEXT)
    (a,) = _drafts(corpus, [_req("a1", "acme")], TEXT[:3])
    assert _hits(anon) == 0 and _hits(a) >= 2


def test_unbound_lookup_fails_closed() -> None:
    corpus = _corpus()
    _put(corpus, _req("a0", "acme"), TEXT)
    tokens, _mask = corpus.batch_get(["a1"], [TEXT[:3]], [3])  # no bind: the empty corpus answers
    assert _hits(list(tokens[:N])) == 0
    corpus.batch_put([TEXT])  # no bind: dropped, no error
    with pytest.raises(ValueError, match="refused"):
        corpus.load_external_corpus_named("ops", [[1, 2, 3]])


def test_lru_drops_idle_namespaces_only() -> None:
    corpus = _corpus(max_namespaces=2)
    for tenant in ("t1", "t2", "t3"):
        _put(corpus, _req(f"{tenant}-0", tenant), TEXT)
    assert len(corpus.namespaces()) == 2 and corpus.dropped == 1
    (t1,) = _drafts(corpus, [_req("t1-1", "t1")], TEXT[:3])  # t1 was dropped: starts empty again
    (t3,) = _drafts(corpus, [_req("t3-1", "t3")], TEXT[:3])
    assert _hits(t1) == 0 and _hits(t3) >= 2


def test_bind_batch_binds_around_the_call() -> None:
    corpus = _corpus()
    worker = SimpleNamespace(ngram_corpus=corpus)
    batch = SimpleNamespace(reqs=[_req("a0", "acme")])
    seen = bind_batch(lambda w, b: list(w.ngram_corpus._bound), worker, batch)
    assert [rid for rid, _ in seen] == ["a0"] and corpus._bound is None
    assert np.all(np.array([ns is not None for _, ns in seen]))


def test_namespace_follows_the_key_not_the_request_id() -> None:
    corpus = _corpus()
    _put(corpus, _req("same-rid", "acme"), TEXT)
    (b,) = _drafts(corpus, [_req("same-rid", "beta")], TEXT[:3])  # a reused id under another tenant's key
    (a,) = _drafts(corpus, [_req("same-rid", "acme")], TEXT[:3])
    assert _hits(b) == 0 and _hits(a) >= 2


def test_tenant_flush_forgets_its_text_only() -> None:
    from sglang_iso.integration.spec_ngram import flush_tenant

    corpus = _corpus()
    _put(corpus, _req("a0", "acme"), TEXT)
    _put(corpus, _req("b0", "beta"), TEXT)
    scheduler = SimpleNamespace(draft_worker=SimpleNamespace(ngram_corpus=corpus))
    assert flush_tenant(scheduler, "acme") >= 1
    a, b = _drafts(corpus, [_req("a1", "acme"), _req("b1", "beta")], TEXT[:3])
    assert _hits(a) == 0 and _hits(b) >= 2  # beta's own text still drafts (control)


def test_cache_off_tenant_text_is_kept_nowhere() -> None:
    corpus = _corpus(off=frozenset({"initech"}))
    _put(corpus, _req("i0", "initech"), TEXT)
    _put(corpus, _req("a0", "acme"), TEXT)
    i, a = _drafts(corpus, [_req("i1", "initech"), _req("a1", "acme")], TEXT[:3])
    assert _hits(i) == 0 and _hits(a) >= 2
    assert len(corpus.namespaces()) == 1


def test_status_and_flush_find_the_corpus_through_the_scheduler() -> None:
    from sglang_iso.integration.spec_ngram import flush_tenant, status

    corpus = _corpus()
    _put(corpus, _req("a0", "acme"), TEXT)
    _put(corpus, _req("b0", "beta"), TEXT)
    scheduler = SimpleNamespace(draft_worker=SimpleNamespace(ngram_corpus=corpus))
    assert status(scheduler) == {"corpus": "namespace", "namespace_corpora": 2, "dropped_corpora": 0}
    assert flush_tenant(scheduler, "*") == 2 and status(scheduler)["namespace_corpora"] == 0
    for other in (SimpleNamespace(draft_worker=None), SimpleNamespace(draft_worker=SimpleNamespace(ngram_corpus=[]))):
        assert status(other) is None and flush_tenant(other, "acme") == 0  # no NGRAM, or upstream's shared corpus
