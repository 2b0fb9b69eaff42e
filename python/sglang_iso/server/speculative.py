"""Which speculative decoding algorithms sglang-iso serves with the tenant cache.

NGRAM is covered: it has no draft model, its verify pass is an ordinary target
forward (the owner check runs before it, over the drafts' window too), and its
draft corpus is partitioned by namespace (``integration/spec_ngram.py``).

STANDALONE (a smaller model of the same vocabulary as the draft) is covered: the
draft model's KV sits at the target's slot indices, so it follows the tree's
namespaces; its buffers are scrubbed on free; every decode step's rows are
sanitized before the first draft pass plans attention (``integration/spec_draft.py``).

EAGLE, EAGLE3 and NEXTN/MTP run through the same worker entry and the same shared
slots, so the same mechanism would apply; they stay refused because their draft KV
at a position depends on the next token (upstream keys its tree by token pairs
for them, which the tenant tree does not do) and no draft head ships with
sglang-iso to test them. Every other algorithm (DFLASH, FROZEN_KV_MTP, UNO, ...)
uses its own worker and is refused.
"""

from __future__ import annotations

COVERED_ALGORITHMS = ("NGRAM", "STANDALONE")
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "MTP")


def uncovered_speculative(algorithm: object) -> str | None:
    """A refusal naming ``--speculative-algorithm`` when it is set and not covered, else None."""
    if algorithm is None:
        return None
    name = str(getattr(algorithm, "name", algorithm)).upper()
    if name in ("", "NONE") or name in COVERED_ALGORITHMS:
        return None
    covered = ", ".join(COVERED_ALGORITHMS)
    if name in EAGLE_FAMILY:
        return (
            f"--speculative-algorithm {algorithm} (its draft KV depends on the next token, which the tenant tree "
            f"does not key by, and it is untested here; covered: {covered})"
        )
    return (
        f"--speculative-algorithm {algorithm} (its draft worker's KV is not scrubbed or owner-checked; "
        f"covered: {covered})"
    )
