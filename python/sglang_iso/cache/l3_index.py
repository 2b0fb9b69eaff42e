"""Residency index of the L3 page store: which stored page belongs to which owner, and what to prune.

Pure bookkeeping (no files, no torch): the store (:mod:`sglang_iso.integration.l3_store`)
tells it each page it wrote, read or deleted, and deletes the pages this index
names. Pages are opaque names; owners and namespaces are opaque labels (the store
passes MACs, never tenant ids). Order is least recently used first (a write or a
read refreshes a page)::

    admit(owner, ns)  -> pages to delete first, or None (the owner may store nothing)
                         1. the owner at its cap   -> the owner's own LRU pages (never another owner's)
                         2. the store at its cap   -> the LRU pages of the whole store (any owner)
    add(name, ...)    -> the page is resident (most recently used)
    drop_owner / drop_namespace / drop_all -> every page of that scope (a flush)
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple


class L3Entry(NamedTuple):
    """Who a stored page belongs to."""

    owner: str
    """Owner label (a tenant or cache group, as the store labels it)."""
    namespace: str
    """Namespace label."""


class L3Index:
    """LRU index of stored pages with a per-owner and an overall cap (in pages). Not thread-safe."""

    def __init__(self, max_pages: int | None) -> None:
        """``max_pages``: most pages stored overall (None: no cap).

        Raises:
            ValueError: ``max_pages < 1``.
        """
        if max_pages is not None and max_pages < 1:
            raise ValueError(f"max_pages must be None or >= 1, got {max_pages!r}")
        self.max_pages = max_pages
        self._pages: OrderedDict[str, L3Entry] = OrderedDict()
        """page name -> entry, least recently used first."""
        self._by_owner: dict[str, OrderedDict[str, None]] = {}
        """owner label -> its page names, least recently used first."""
        self._quota: dict[str, int] = {}
        """owner label -> most pages it may store (absent: only the overall cap)."""
        self.pruned_pages: dict[str, int] = {}
        """owner label -> its pages named for deletion by ``admit`` or ``set_quota`` so far."""

    # ----------------------------------------------------------------------------------------------- public API

    def admit(self, owner: str) -> list[str] | None:
        """Room for one more page of ``owner``: the pages to delete first (the caller deletes, then ``remove``s
        them), or None when the owner may store nothing (quota 0 pages). Changes nothing itself."""
        quota = self._quota.get(owner)
        if quota is not None and quota < 1:
            return None
        victims: list[str] = []
        own = self._by_owner.get(owner, OrderedDict())
        if quota is not None and len(own) >= quota:
            victims += list(own)[: len(own) - quota + 1]
        if self.max_pages is not None:
            excess = len(self._pages) - len(victims) + 1 - self.max_pages
            if excess > 0:
                chosen = set(victims)
                victims += [name for name in self._pages if name not in chosen][:excess]
        return victims

    def add(self, name: str, owner: str, namespace: str) -> None:
        """Record a stored page (or refresh it) as the most recently used."""
        if name in self._pages:
            self.touch(name)
            return
        self._pages[name] = L3Entry(owner, namespace)
        self._by_owner.setdefault(owner, OrderedDict())[name] = None

    def touch(self, name: str) -> None:
        """A page was read: most recently used now (unknown names are ignored)."""
        entry = self._pages.get(name)
        if entry is not None:
            self._pages.move_to_end(name)
            self._by_owner[entry.owner].move_to_end(name)

    def remove(self, name: str, *, pruned: bool = False) -> None:
        """Forget a page (deleted, or found missing); ``pruned``: it was deleted for room (counted)."""
        entry = self._pages.pop(name, None)
        if entry is None:
            return
        own = self._by_owner[entry.owner]
        del own[name]
        if not own:
            del self._by_owner[entry.owner]
        if pruned:
            self.pruned_pages[entry.owner] = self.pruned_pages.get(entry.owner, 0) + 1

    def set_quota(self, owner: str, pages: int | None) -> list[str]:
        """Cap ``owner`` at ``pages`` (None: only the overall cap); returns its LRU pages now over the cap."""
        if pages is None:
            self._quota.pop(owner, None)
            return []
        if pages < 0:
            raise ValueError(f"quota must be None or >= 0 pages, got {pages!r}")
        self._quota[owner] = pages
        own = list(self._by_owner.get(owner, ()))
        return own[: max(len(own) - pages, 0)]

    def over_cap(self) -> list[str]:
        """The store's LRU pages above the overall cap (after a start with more pages than it)."""
        if self.max_pages is None:
            return []
        return list(self._pages)[: max(len(self._pages) - self.max_pages, 0)]

    def drop_owner(self, owner: str) -> list[str]:
        """Every page of ``owner`` (the caller deletes them, then ``remove``s them)."""
        return list(self._by_owner.get(owner, ()))

    def drop_namespace(self, namespace: str) -> list[str]:
        return [name for name, entry in self._pages.items() if entry.namespace == namespace]

    def drop_all(self) -> list[str]:
        return list(self._pages)

    def __contains__(self, name: object) -> bool:
        return name in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def resident_pages(self, owner: str) -> int:
        return len(self._by_owner.get(owner, ()))

    def quota(self, owner: str) -> int | None:
        return self._quota.get(owner)

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if the owner lists and the page list disagree or a cap is exceeded."""
        by_owner = {name: owner for owner, names in self._by_owner.items() for name in names}
        assert by_owner == {name: e.owner for name, e in self._pages.items()}, f"{len(by_owner)=} {len(self._pages)=}"
        assert all(self._by_owner.values()), "an empty owner list is kept"
        for owner, quota in self._quota.items():
            assert self.resident_pages(owner) <= quota, f"{owner=} {quota=} {self.resident_pages(owner)=}"
        assert self.max_pages is None or len(self._pages) <= self.max_pages, f"{len(self._pages)=} {self.max_pages=}"
