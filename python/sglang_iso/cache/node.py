"""Radix tree nodes and page-aligned key helpers (internal to :mod:`sglang_iso.cache`).

Only :class:`~sglang_iso.cache.tenant_radix_tree.TenantRadixTree` creates or
mutates nodes; callers hold them only inside an opaque ``NodeHandle``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

RootKind = Literal["private", "shared", "cont"]


class TreeNode:
    """One edge of the radix tree: a run of tokens and the KV slots holding them."""

    __slots__ = ("children", "key", "last_access", "lock_ref", "owner", "parent", "value")

    def __init__(self, owner: str, key: tuple[int, ...], value: list[int], parent: TreeNode | None) -> None:
        self.owner = owner
        """Namespace id that created the node; set here and never reassigned (splits copy it)."""
        self.key = key
        """Token ids on this edge; a whole number of pages, empty only on roots. Mutated only by splits."""
        self.value = value
        """KV pool slot per token of ``key`` (same length). Owned by the tree until passed to ``free_fn``."""
        self.parent = parent
        """Parent node; None on roots and on nodes that were removed from the tree."""
        self.children: dict[tuple[int, ...], TreeNode] = {}
        """Children keyed by the first page of their key."""
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
        super().__init__(owner, (), [], None)
        self.kind: RootKind = kind
        """``private``: a namespace's own tree. ``shared``: an operator-declared prefix.
        ``cont``: a namespace's continuations after the shared prefix ``shared_name``."""
        self.shared_name = shared_name
        """Declared shared prefix name for ``shared`` and ``cont`` roots; None for ``private``."""

    def __repr__(self) -> str:
        return f"RootNode(owner={self.owner!r}, kind={self.kind!r}, shared_name={self.shared_name!r})"


def page_key(tokens: Sequence[int], start: int, page_size: int) -> tuple[int, ...]:
    """Child-dict key of the page of ``tokens`` starting at ``start``."""
    return tuple(tokens[start : start + page_size])


def common_prefix_len(key: tuple[int, ...], tokens: Sequence[int], start: int, page_size: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[start:]``, rounded down to whole pages."""
    limit = min(len(key), len(tokens) - start)
    n = 0
    while n < limit and key[n] == tokens[start + n]:
        n += 1
    return n - n % page_size


def iter_subtree(root: TreeNode) -> list[TreeNode]:
    """All nodes under ``root`` (excluded), parents before children."""
    out: list[TreeNode] = []
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out
