"""Tree keys made of token pairs, for speculative decoding with an EAGLE-style draft head.

An EAGLE draft head computes its KV at position ``i`` from the target's hidden state at ``i`` and the
embedding of token ``i + 1``. So a cached draft KV slot is only right for a continuation that agrees
on the *next* token too. Keying the tree by pairs makes a match stop one position earlier:

    tokens:  t0   t1   t2   t3            (4 tokens)
    key:     (t0,t1) (t1,t2) (t2,t3)      (3 entries; entry i covers slot i)
    slots:   s0   s1   s2   [s3 stays with the request; it is not cached]

This is the rule SGLang's own radix tree uses for EAGLE (its bigram key view). Each pair is packed
into one int64 (``t[i] << 32 | t[i+1]``), so the tree itself is unchanged: it stores ``array('q')`` keys
of any meaning. Packing is one-to-one for token ids in ``[0, 2**31)``; anything else is refused.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

PAIR_SHIFT = 32
MAX_TOKEN = 1 << 31
"""Token ids must be below this to pack (every real vocabulary is far smaller)."""


def pair_key(tokens: Sequence[int]) -> array:
    """``len(tokens) - 1`` packed pairs ``(tokens[i], tokens[i + 1])`` (empty for fewer than two tokens).

    Raises:
        ValueError: a token id is not an integer in ``[0, 2**31)``.
    """
    if len(tokens) < 2:
        return array("q")
    if type(tokens) is array and tokens.typecode == "q":
        ids = np.frombuffer(tokens, dtype=np.int64)
    else:
        try:
            ids = np.asarray(tokens, dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"tokens must be ints in [0, 2**31): {exc}") from None
        if ids.ndim != 1:
            raise ValueError(f"tokens must be a flat sequence, got shape {ids.shape}")
    if int(ids.min()) < 0 or int(ids.max()) >= MAX_TOKEN:
        raise ValueError(f"tokens must be ints in [0, 2**31), got min {int(ids.min())}, max {int(ids.max())}")
    packed = (ids[:-1] << PAIR_SHIFT) | ids[1:]
    out = array("q")
    out.frombytes(packed.tobytes())
    return out


def unpack_pairs(key: Sequence[int]) -> list[int]:
    """The tokens a packed key was made from (``len(key) + 1`` of them; empty for an empty key)."""
    if not key:
        return []
    mask = (1 << PAIR_SHIFT) - 1
    return [int(key[0]) >> PAIR_SHIFT, *(int(k) & mask for k in key)]
