"""Radix tree nodes and page-aligned key helpers (internal to :mod:`sglang_iso.cache`).

Only :class:`~sglang_iso.cache.tenant_radix_tree.TenantRadixTree` creates or
mutates nodes; callers hold them only inside an opaque ``NodeHandle``.

Keys (token ids) and values (KV slots) are both ``array('q')``: they slice,
compare and concatenate in C, hold no per-element Python objects, and a value
is viewed by numpy without a copy, so walks and evictions never loop over
tokens or slots in Python.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Literal

RootKind = Literal["private", "shared", "cont"]
ChildKey = int | tuple[int, ...]
"""Child-dict key: the first token (page size 1) or the first page as a tuple (see :func:`page_key`)."""


class TreeNode:
    """One edge of the radix tree: a run of tokens and the KV slots holding them."""

    __slots__ = ("children", "key", "last_access", "lock_ref", "owner", "parent", "value")

    def __init__(self, owner: str, key: array, value: array, parent: TreeNode | None) -> None:
        self.owner = owner
        """Namespace id that created the node; set here and never reassigned (splits copy it)."""
        self.key = key
        """Token ids on this edge, ``array('q')``; a whole number of pages, empty only on roots. Mutated only by
        splits."""
        self.value = value
        """KV pool slot per token of ``key`` (same length), ``array('q')``; never resized in place (numpy views of
        it are taken). Owned by the tree until passed to ``free_fn``."""
        self.parent = parent
        """Parent node; None on roots and on nodes that were removed from the tree."""
        self.children: dict[ChildKey, TreeNode] = {}
        """Children keyed by the first page of their key (:func:`page_key`)."""
        self.lock_ref = 0
        """Number of outstanding locks covering this node (>= 0); > 0 means protected from eviction."""
        self.last_access = 0
        """Logical clock of the last match/insert that touched the node (LRU order)."""

    def __repr__(self) -> str:
        return f"TreeNode(owner={self.owner!r}, len={len(self.key)}, lock_ref={self.lock_ref})"


class RootNode(TreeNode):
    """A subtree root: holds no tokens and is never evicted or locked."""

    __slots__ = ("kind", "shared_name")

    def __init__(self, owner: str, kind: RootKind, shared_name: str | None) -> None:
        super().__init__(owner, array("q"), array("q"), None)
        self.kind: RootKind = kind
        """``private``: a namespace's own tree. ``shared``: an operator-declared prefix.
        ``cont``: a namespace's continuations after the shared prefix ``shared_name``."""
        self.shared_name = shared_name
        """Declared shared prefix name for ``shared`` and ``cont`` roots; None for ``private``."""

    def __repr__(self) -> str:
        return f"RootNode(owner={self.owner!r}, kind={self.kind!r}, shared_name={self.shared_name!r})"


def page_key(tokens: Sequence[int], start: int, page_size: int) -> ChildKey:
    """Child-dict key of the page of ``tokens`` starting at ``start``.

    NOTE: page size 1 keys by the bare token (as upstream does), because building a 1-tuple per step costs
    more than the rest of the step. The tree's hot loops inline this expression; keep them in sync.
    """
    return tokens[start] if page_size == 1 else tuple(tokens[start : start + page_size])


def common_prefix_len(key: Sequence[int], tokens: Sequence[int], start: int, page_size: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[start:]``, rounded down to whole pages.

    Both are ``array('q')``: one C-level slice compare settles the usual full match; otherwise gallop in
    doubling windows and bisect the first differing one (O(log n) slice compares, no per-token loop).
    """
    n = min(len(key), len(tokens) - start)
    if (key if n == len(key) else key[:n]) == tokens[start : start + n]:
        return n - n % page_size
    # Invariant: key[:lo] == tokens[start : start + lo]; the first difference is in [lo, n).
    lo, step = 0, 8
    while True:
        hi = min(lo + step, n)
        if key[lo:hi] != tokens[start + lo : start + hi]:
            break
        lo, step = hi, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[lo:mid] == tokens[start + lo : start + mid]:
            lo = mid
        else:
            hi = mid
    return lo - lo % page_size


def iter_subtree(root: TreeNode) -> list[TreeNode]:
    """All nodes under ``root`` (excluded), parents before children."""
    out: list[TreeNode] = []
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out
