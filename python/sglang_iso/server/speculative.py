"""Which speculative decoding algorithms sglang-iso serves with the tenant cache.

NGRAM is covered: it has no draft model, its verify pass is an ordinary target
forward (the owner check runs before it, over the drafts' window too), and its
draft corpus is partitioned by namespace (``integration/spec_ngram.py``).

Every algorithm with a draft model (EAGLE, EAGLE3, NEXTN/MTP, STANDALONE, ...) is
refused at start: the draft model's KV pool is neither scrubbed on free nor
owner-checked, and its workers plan attention outside the checked forward.
"""

from __future__ import annotations

COVERED_ALGORITHMS = ("NGRAM",)


def uncovered_speculative(algorithm: object) -> str | None:
    """A refusal naming ``--speculative-algorithm`` when it is set and not covered, else None."""
    if algorithm is None:
        return None
    name = str(getattr(algorithm, "name", algorithm)).upper()
    if name in ("", "NONE") or name in COVERED_ALGORITHMS:
        return None
    return (
        f"--speculative-algorithm {algorithm} (a draft model's KV is not scrubbed or owner-checked; "
        f"covered: {', '.join(COVERED_ALGORITHMS)})"
    )
