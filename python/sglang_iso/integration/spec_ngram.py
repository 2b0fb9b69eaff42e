"""NGRAM speculative decoding with one draft corpus per verified namespace.

Upstream keeps one n-gram corpus for the whole server: every request's text is
inserted, and every request's drafts are matched against all of it. A tenant's
accept rate, and so its tokens per second, then tells it whether another tenant
generated the same text. Here the corpus is partitioned by the request's tree
namespace (``identity/tags.py``, verified from the request's ``extra_key``):

    namespace "t:acme:..."   -> its own NgramCorpus (inserted into and matched only by acme's requests;
                                one per cache group, as the tree shares a group's namespace)
    namespace None           -> an always-empty corpus (untagged or forged keys: no drafts from anyone)
    tenant with cache "off"  -> the always-empty corpus too (its text is kept nowhere)

The worker's ``ngram_corpus`` is replaced by :class:`NamespacedNgramCorpus`
right after ``NGRAMWorker.__init__``; around ``_prepare_draft_tokens`` and
``_update_ngram_corpus`` the batch's namespaces (in ``batch.reqs`` order) are
bound to it, so ``batch_get``/``batch_put`` split the batch by namespace. The corpus is
found again through the scheduler that owns the worker (``scheduler.draft_worker``), for
status and for a tenant's flush or erase: no process-level registry.

``SGLANG_ISO_NGRAM_CORPUS=shared`` keeps upstream's single corpus, an explicit
operator choice: accept rates then reveal other tenants' text (a timing channel).
Operator corpora (``--speculative-ngram-external-corpus-path``, the external corpus
API) are refused with per-namespace corpora.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import numpy as np

from sglang_iso import envvars
from sglang_iso.coverage import NotCoveredError
from sglang_iso.identity.tags import tenant_of
from sglang_iso.settings import Settings
from sglang_iso.settings import current as current_settings

logger = logging.getLogger(__name__)

_EMPTY_CAPACITY = 64
_MAX_RESOLVED = 4096


def partition_corpus(_result: None, worker: Any, *_args: Any, **_kwargs: Any) -> None:
    """AFTER ``NGRAMWorker.__init__``: replace the global corpus by per-namespace corpora.

    Raises:
        NotCoveredError: an external (operator) corpus was configured.
    """
    from sglang.srt.runtime_context import get_spec

    settings = current_settings()
    if settings.ngram_corpus_shared:
        logger.warning(
            "sglang-iso: %s=shared: one NGRAM corpus for all tenants; accept rates and tokens per second "
            "reveal other tenants' text",
            envvars.NGRAM_CORPUS.name,
        )
        return
    spec = get_spec()
    if spec.speculative_ngram_external_corpus_path is not None:
        raise NotCoveredError(
            "sglang-iso: --speculative-ngram-external-corpus-path is not supported with per-namespace NGRAM "
            f"corpora; drop it or set {envvars.NGRAM_CORPUS.name}=shared"
        )
    kwargs = {
        "min_bfs_breadth": spec.speculative_ngram_min_bfs_breadth,
        "max_bfs_breadth": spec.speculative_ngram_max_bfs_breadth,
        "match_type": spec.speculative_ngram_match_type,
        "max_trie_depth": spec.speculative_ngram_max_trie_depth,
        "draft_token_num": spec.speculative_num_draft_tokens,
    }
    capacity = min(int(spec.speculative_ngram_capacity), settings.ngram_ns_capacity)
    max_ns = settings.ngram_max_namespaces
    resolver, no_retention = _resolver(settings)
    worker.ngram_corpus = NamespacedNgramCorpus(
        resolver, kwargs, capacity=capacity, max_namespaces=max_ns, no_retention=no_retention
    )
    logger.info("sglang-iso: NGRAM draft corpus partitioned by namespace (capacity %d, up to %d)", capacity, max_ns)


def bind_batch(original: Any, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND the worker's corpus lookups and inserts: bind the batch's namespaces for their duration."""
    corpus = getattr(worker, "ngram_corpus", None)
    if not isinstance(corpus, NamespacedNgramCorpus):
        return original(worker, batch, *args, **kwargs)
    corpus.bind(batch.reqs)
    try:
        return original(worker, batch, *args, **kwargs)
    finally:
        corpus.unbind()


def corpus_of(scheduler: Any) -> NamespacedNgramCorpus | None:
    """The partitioned corpus of ``scheduler``'s NGRAM draft worker; None without one (no NGRAM, or the
    operator's ``shared`` mode)."""
    corpus = getattr(getattr(scheduler, "draft_worker", None), "ngram_corpus", None)
    return corpus if isinstance(corpus, NamespacedNgramCorpus) else None


def status(scheduler: Any) -> dict[str, Any] | None:
    """For /get_server_info (admin only): the corpus mode and how many namespace corpora exist; None
    without a partitioned corpus. Counts only, never which tenants."""
    corpus = corpus_of(scheduler)
    if corpus is None:
        return None
    return {"corpus": "namespace", "namespace_corpora": len(corpus.namespaces()), "dropped_corpora": corpus.dropped}


def flush_tenant(scheduler: Any, tenant: str) -> int:
    """Drop the NGRAM corpora of ``tenant``'s namespaces (``"*"``: all) in ``scheduler``; returns how many."""
    corpus = corpus_of(scheduler)
    return corpus.drop_tenant(tenant) if corpus is not None else 0


def _resolver(settings: Settings) -> tuple[Any, frozenset[str]]:
    """The namespace resolver and the owners (tenant or group ids) whose cache policy is ``off``."""
    from sglang_iso.identity.tags import NamespaceResolver

    config = settings.tenants()
    if config is None:
        return NamespaceResolver(None), frozenset()
    off = frozenset(t.group or t.id for t in config.tenants.values() if t.cache_policy == "off")
    return NamespaceResolver(config.secret), off


class NamespacedNgramCorpus:
    """Drop-in for SGLang's ``NgramCorpus``: one corpus per namespace. Scheduler thread only."""

    def __init__(
        self,
        resolver: Any,
        corpus_kwargs: dict[str, Any],
        *,
        capacity: int,
        max_namespaces: int,
        no_retention: frozenset[str] = frozenset(),
    ) -> None:
        self.resolver = resolver
        self.no_retention = no_retention  # owners whose text is kept nowhere (cache policy "off")
        self.draft_token_num = int(corpus_kwargs["draft_token_num"])
        self._kwargs = corpus_kwargs
        self._capacity = capacity
        self._max = max(1, max_namespaces)
        self._corpora: collections.OrderedDict[str, Any] = collections.OrderedDict()  # LRU order
        self._empty = self._new_corpus(_EMPTY_CAPACITY)  # never inserted into
        # (extra_key, cache_salt) -> namespace: the resolution is a pure function of the key, so it is cached
        # by the key itself (never by request id) and bounded.
        self._resolved: dict[tuple[str | None, str | None], str | None] = {}
        self._bound: list[tuple[str, str | None]] | None = None  # (rid, namespace) of the batch being served
        self.dropped = 0  # namespace corpora dropped to stay under max_namespaces

    # ----------------------------------------------------------- binding
    def bind(self, reqs: list[Any]) -> None:
        self._bound = [(req.rid, self._namespace_of(req)) for req in reqs]

    def unbind(self) -> None:
        self._bound = None

    def namespaces(self) -> list[str]:
        return list(self._corpora)

    def drop_tenant(self, tenant: str) -> int:
        """Forget the text of ``tenant``'s namespaces (``"*"``: every namespace), e.g. on a tenant flush."""
        doomed = [ns for ns in self._corpora if tenant == "*" or tenant_of(ns) == tenant]
        for ns in doomed:
            del self._corpora[ns]
        return len(doomed)

    # ----------------------------------------------------------- NgramCorpus API
    def batch_get(self, req_ids: list[str], batch_tokens: list[list[int]], total_lens: list[int]) -> Any:
        n = self.draft_token_num
        bound = self._bound
        if bound is None or [rid for rid, _ in bound] != list(req_ids):
            # SECURITY: fail closed; without the batch's namespaces nobody gets drafts from any corpus.
            logger.error("sglang-iso: NGRAM lookup without bound namespaces; drafting from an empty corpus")
            return self._empty.batch_get(req_ids, batch_tokens, total_lens)
        tokens = np.zeros(len(req_ids) * n, dtype=np.int64)
        mask = np.zeros(len(req_ids) * n * n, dtype=np.int64)
        for ns, idx in self._groups(bound).items():
            corpus = self._corpus(ns)
            got_tokens, got_mask = corpus.batch_get(
                [req_ids[i] for i in idx], [batch_tokens[i] for i in idx], [total_lens[i] for i in idx]
            )
            for j, i in enumerate(idx):
                tokens[i * n : (i + 1) * n] = got_tokens[j * n : (j + 1) * n]
                mask[i * n * n : (i + 1) * n * n] = got_mask[j * n * n : (j + 1) * n * n]
        return tokens, mask

    def batch_put(self, batch_tokens: list[list[int]]) -> None:
        bound = self._bound
        if bound is None or len(bound) != len(batch_tokens):
            # SECURITY: fail closed; text whose namespace is unknown goes into no corpus.
            logger.error("sglang-iso: NGRAM insert without bound namespaces; dropped")
            return
        for ns, idx in self._groups(bound).items():
            if ns is not None:
                self._corpus(ns).batch_put([batch_tokens[i] for i in idx])

    def synchronize(self) -> None:
        for corpus in self._corpora.values():
            corpus.synchronize()

    def erase_match_state(self, req_ids: list[str]) -> None:
        for corpus in (self._empty, *self._corpora.values()):
            corpus.erase_match_state(list(req_ids))

    def reset(self) -> None:
        self._corpora.clear()
        self._empty.reset()
        self._resolved.clear()

    @property
    def remaining_token_budget(self) -> int:
        return 0

    def load_external_corpus_named(self, corpus_id: str, chunks: Any) -> int:
        raise ValueError(
            f"external NGRAM corpus {corpus_id!r} refused: sglang-iso keeps one draft corpus per tenant namespace"
        )

    def commit_external_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        raise ValueError(f"external NGRAM corpus {corpus_id!r} refused (per-namespace corpora)")

    def remove_external_corpus(self, corpus_id: str) -> None:
        raise ValueError(f"no external NGRAM corpus {corpus_id!r} (per-namespace corpora)")

    def list_external_corpora(self) -> dict[str, int]:
        return {}

    # ----------------------------------------------------------- internals
    def _namespace_of(self, req: Any) -> str | None:
        key = (req.extra_key, getattr(req, "cache_salt", None))
        if key not in self._resolved:
            if len(self._resolved) >= _MAX_RESOLVED:
                self._resolved.clear()
            ns = self.resolver.resolve_namespace(*key)
            off = ns is not None and ns.tenant in self.no_retention
            self._resolved[key] = None if off or ns is None else ns.key
        return self._resolved[key]

    @staticmethod
    def _groups(bound: list[tuple[str, str | None]]) -> dict[str | None, list[int]]:
        groups: dict[str | None, list[int]] = {}
        for i, (_rid, ns) in enumerate(bound):
            groups.setdefault(ns, []).append(i)
        return groups

    def _corpus(self, ns: str | None) -> Any:
        if ns is None:
            return self._empty
        corpus = self._corpora.get(ns)
        if corpus is not None:
            self._corpora.move_to_end(ns)
            return corpus
        busy = {n for _rid, n in self._bound or ()}
        # NOTE: dropping an idle namespace's corpus depends on how many namespaces are active, never on
        # what any other namespace's text is.
        for old in [k for k in self._corpora if k not in busy][: max(0, len(self._corpora) + 1 - self._max)]:
            del self._corpora[old]
            self.dropped += 1
        corpus = self._corpora[ns] = self._new_corpus(self._capacity)
        return corpus

    def _new_corpus(self, capacity: int) -> Any:
        from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

        return NgramCorpus(capacity=capacity, **self._kwargs)
