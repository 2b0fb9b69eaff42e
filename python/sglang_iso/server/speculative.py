"""Which speculative decoding algorithms sglang-iso serves with the tenant cache.

NGRAM is covered: it has no draft model, its verify pass is an ordinary target
forward (the owner check runs before it, over the drafts' window too), and its
draft corpus is partitioned by namespace (``integration/spec_ngram.py``).

STANDALONE (a smaller model of the same vocabulary as the draft) is covered: the
draft model's KV sits at the target's slot indices, so it follows the tree's
namespaces; its buffers are scrubbed on free; every decode step's rows are
sanitized before the first draft pass plans attention (``integration/spec_draft.py``).

EAGLE, EAGLE3 and NEXTN (MTP; SGLang runs it as EAGLE) are covered the same way: the
same worker entry, the same shared slots. Their draft head's KV at a position depends
on the next token too, so with them the tree is keyed by token pairs, as SGLang's own
tree does (``cache/pair_keys.py``). Every other algorithm (DFLASH, FROZEN_KV_MTP, UNO,
...) uses its own worker and is refused, and so is a draft model with the host tier
(it keeps no draft KV) or with PD disaggregation (draft KV and hidden states cross
workers outside the transfer quarantine).
"""

from __future__ import annotations

DRAFT_MODEL_ALGORITHMS = ("STANDALONE", "EAGLE", "EAGLE3", "NEXTN")
"""Covered algorithms with a draft model (its KV shares the target's slots); EAGLE-style ones key by pairs."""
COVERED_ALGORITHMS = ("NGRAM", *DRAFT_MODEL_ALGORITHMS)


def uncovered_speculative(algorithm: object) -> str | None:
    """A refusal naming ``--speculative-algorithm`` when it is set and not covered, else None."""
    name = _name(algorithm)
    if name in ("", "NONE") or name in COVERED_ALGORITHMS:
        return None
    covered = ", ".join(COVERED_ALGORITHMS)
    return (
        f"--speculative-algorithm {algorithm} (its draft worker's KV is not scrubbed or owner-checked; "
        f"covered: {covered})"
    )


def has_draft_model(algorithm: object) -> bool:
    """True for a covered algorithm that runs a draft model (STANDALONE and the EAGLE family)."""
    return _name(algorithm) in DRAFT_MODEL_ALGORITHMS


def _name(algorithm: object) -> str:
    """The upper-case name of a flag value or a ``SpeculativeAlgorithm`` member ("" for None)."""
    return "" if algorithm is None else str(getattr(algorithm, "name", algorithm)).upper()
