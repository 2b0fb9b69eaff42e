"""Runnable invariants of :class:`~sglang_iso.cache.tenant_radix_tree.TenantRadixTree` (tests call it after every op).

Accounting equation, per namespace ``ns``::

    evictable[ns] = sum(len(n.value) for n owned by ns if n.lock_ref == 0)
    protected[ns] = sum(len(n.value) for n owned by ns if n.lock_ref >  0)
    evictable_size() + protected_size() = total_size() = len(resident slots)

and ``state.leaves`` of each namespace is exactly its nodes that ``_is_evictable`` accepts.
"""

from __future__ import annotations

from array import array
from collections import Counter
from typing import TYPE_CHECKING

from sglang_iso.cache.node import RootNode, TreeNode, page_key

if TYPE_CHECKING:
    from sglang_iso.cache.tenant_radix_tree import TenantRadixTree


def check_tree_integrity(tree: TenantRadixTree) -> None:
    """Raise ``AssertionError`` naming the numbers if any invariant of ``tree`` fails. Mutates nothing."""
    page = tree.page_size
    seen: set[int] = set()
    evictable: Counter[str] = Counter()
    protected: Counter[str] = Counter()
    slots: Counter[int] = Counter()
    leaves: dict[str, set[int]] = {}
    roots: list[tuple[RootNode, str]] = [(r, ns) for ns, r in tree._private.items()]
    for name, root in tree._shared_roots.items():
        decl = tree._shared[name]
        roots.append((root, decl.namespace))
        kids = list(root.children.values())
        assert len(kids) <= 1, f"shared prefix {name!r} has {len(kids)=} nodes"
        for kid in kids:
            assert kid.key == decl.key, f"shared prefix {name!r} stores {len(kid.key)=} != {len(decl.key)=}"
    for name, by_ns in tree._cont.items():
        shared_nodes = list(tree._shared_roots[name].children.values())
        for ns, root in by_ns.items():
            roots.append((root, ns))
            assert root.shared_name == name, f"{root.shared_name=} {name=}"
            if root.children:
                assert shared_nodes, f"continuations of {ns=} exist under unfilled shared prefix {name=}"
    for root, expected_owner in roots:
        assert root.owner == expected_owner, f"{root.owner=} {expected_owner=}"
        assert root.parent is None and root.lock_ref == 0, f"{root!r} {root.lock_ref=}"
        assert id(root) not in seen, f"root {root!r} reachable twice"
        seen.add(id(root))
        stack: list[TreeNode] = [root]
        while stack:
            parent = stack.pop()
            for child_key, node in parent.children.items():
                assert id(node) not in seen, f"{node!r} reachable from more than one place"
                seen.add(id(node))
                assert node.owner == root.owner, f"{node.owner=} under root {root.owner=}"
                assert node.parent is parent, f"{node!r} has a wrong parent pointer"
                assert not isinstance(node, RootNode), f"{node!r} nested root"
                assert len(node.key) == len(node.value), f"{len(node.key)=} {len(node.value)=}"
                assert node.key and len(node.key) % page == 0, f"{len(node.key)=} {page=}"
                assert child_key == page_key(node.key, 0, page), f"{child_key=} {node.key[:page]=}"
                assert node.lock_ref >= 0, f"{node.lock_ref=}"
                if not isinstance(parent, RootNode):
                    assert parent.lock_ref >= node.lock_ref, f"{parent.lock_ref=} {node.lock_ref=}"
                (protected if node.lock_ref else evictable)[node.owner] += len(node.value)
                assert type(node.value) is array and node.value.typecode == "q", f"{type(node.value)=}"
                if tree._is_evictable(node):
                    leaves.setdefault(node.owner, set()).add(id(node))
                slots.update(node.value)
                stack.append(node)
    # NOTE: every lock on a continuation node also locked the shared node, because handles cover both segments.
    for name, by_ns in tree._cont.items():
        shared_lock = sum(n.lock_ref for n in tree._shared_roots[name].children.values())
        for root in by_ns.values():
            cont_lock = sum(n.lock_ref for n in root.children.values())
            assert shared_lock >= cont_lock, f"{name=} {shared_lock=} {cont_lock=}"
    repeated = [slot for slot, count in slots.items() if count > 1]
    assert not repeated, f"slots owned by more than one node: {repeated[:10]=}"
    assert set(slots) == tree._resident.held(), f"{len(slots)=} {len(tree._resident)=}"
    for ns, state in tree._ns.items():
        assert state.evictable == evictable[ns], f"{ns=} {state.evictable=} {evictable[ns]=}"
        assert state.protected == protected[ns], f"{ns=} {state.protected=} {protected[ns]=}"
        assert state.evictable >= 0 and state.protected >= 0, f"{ns=} {state.evictable=} {state.protected=}"
    total_evictable, total_protected = sum(evictable.values()), sum(protected.values())
    assert tree._evictable_total == total_evictable, f"{tree._evictable_total=} {total_evictable=}"
    assert tree._protected_total == total_protected, f"{tree._protected_total=} {total_protected=}"
    for ns, state in tree._ns.items():
        kept = {id(n) for n in state.leaves}
        want = leaves.get(ns, set())
        assert kept == want, (
            f"{ns=} evictable leaves: {len(kept)=} {len(want)=} {len(kept - want)=} {len(want - kept)=}"
        )
    every = {id(n) for n in tree._leaves}
    union = set().union(*leaves.values())
    assert every == union, f"global evictable leaves: {len(every)=} {len(union)=} {len(every ^ union)=}"
    unknown = (set(evictable) | set(protected)) - set(tree._ns)
    assert not unknown, f"nodes owned by namespaces without accounting: {unknown=}"
    total, ev, pr = tree.total_size(), tree.evictable_size(), tree.protected_size()
    assert ev + pr == total == len(tree._resident), f"{ev=} {pr=} {total=} {len(tree._resident)=}"
