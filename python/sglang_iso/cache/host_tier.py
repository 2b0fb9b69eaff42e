"""Host (L2) tier of the tenant cache: pages evicted from the device, kept per namespace.

Pure bookkeeping (no torch, no SGLang): which host page holds which page of
which namespace's prefix. The bytes live in a host buffer the caller owns
(:mod:`sglang_iso.integration.host_cache`); this module hands out host page ids
and tells the caller when a page's bytes must be copied or scrubbed.

Keys. A page is found by the digest chain of its prefix *inside its namespace*::

    d[-1] = H("sglang-iso/host" | namespace id)
    d[i]  = H(d[i-1] | tokens of page i)        (BLAKE2b-128)

The namespace id is the verified one (an HMAC of the tenant, never a client
string), so the same tokens in two namespaces give unrelated digests, and each
namespace has its own index (``namespace -> digest -> host page``): a lookup
can only ever see the requester's own pages. Every host page also carries an
owner tag, checked on every lookup (a mismatch fails closed: miss, counted).

Lifecycle (exclusive tiers: a page is on the device or on the host, not both)::

    device eviction -> put(ns, path, start)  -> host pages to fill (caller copies device -> host)
    match           -> take(ns, tokens, p)    -> host pages to load (caller copies host -> device,
                                                  then release(pages))
    host full       -> LRU host pages of any namespace are dropped (scrubbed)
    group over quota-> the group's own LRU host pages are dropped (scrubbed): set_quota
                       (a quota group is a tenant's namespaces, or one namespace alone)
    flush(ns)/reset -> every host page of ns is dropped (scrubbed)

Every page leaving the tier goes through ``scrub_fn`` before it can be handed
out again (poison-and-check tested).
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

logger = logging.getLogger(__name__)

_DIGEST_BYTES = 16
_SEED_TAG = b"sglang-iso/host\x00"


class HostStats(NamedTuple):
    """Host residency of one namespace."""

    resident_tokens: int
    """Tokens held on the host now."""
    written_tokens: int
    """Tokens written back from the device so far."""
    loaded_tokens: int
    """Tokens loaded back to the device so far (hits served from the host)."""


class LazyChain:
    """Page digests of ``tokens`` in namespace ``ns`` (see module doc), computed in order on first access.

    NOTE: a lookup usually stops at the first miss, so a cold prompt costs one digest, not one per page.
    """

    def __init__(self, ns: str, tokens: Sequence[int], page_size: int) -> None:
        self._key = tokens if isinstance(tokens, array) and tokens.typecode == "q" else array("q", tokens)
        self._page_size = page_size
        self._pages = len(tokens) // page_size
        self._out: list[bytes] = []
        self._prev = hashlib.blake2b(_SEED_TAG + ns.encode(), digest_size=_DIGEST_BYTES).digest()

    def __len__(self) -> int:
        return self._pages

    def __getitem__(self, i: int) -> bytes:
        if not 0 <= i < self._pages:
            raise IndexError(i)
        ps = self._page_size
        while len(self._out) <= i:
            pos = len(self._out) * ps
            self._prev = hashlib.blake2b(
                self._prev + self._key[pos : pos + ps].tobytes(), digest_size=_DIGEST_BYTES
            ).digest()
            self._out.append(self._prev)
        return self._out[i]


_Group = tuple[str, str]
"""A quota group: ``("ns", namespace)`` (a namespace alone) or ``("group", name)`` (set by ``set_quota``)."""

Digests = list[bytes] | LazyChain
"""Page digests as :meth:`HostTier.chain` or :meth:`HostTier.lazy_chain` give them."""


class HostTier:
    """Host page index per namespace. Not thread-safe; call from the scheduler thread."""

    def __init__(self, page_size: int, capacity_pages: int, scrub_fn: Callable[[list[int]], None]) -> None:
        """Args:
            page_size: tokens per page (the device pool's).
            capacity_pages: host pages available (ids ``0 .. capacity_pages - 1``).
            scrub_fn: zeroes host pages; called on every page before it returns to the free list.

        Raises:
            ValueError: ``page_size < 1`` or ``capacity_pages < 0``.
        """
        if page_size < 1 or capacity_pages < 0:
            raise ValueError(f"need page_size >= 1 and capacity_pages >= 0, got {page_size=} {capacity_pages=}")
        self.page_size = page_size
        self.capacity_pages = capacity_pages
        self._scrub_fn = scrub_fn
        self._free: list[int] = list(range(capacity_pages - 1, -1, -1))
        """Free host page ids (pop from the end)."""
        self._index: dict[str, dict[bytes, int]] = {}
        """namespace -> prefix digest -> host page, in the namespace's LRU order (least recent first)."""
        self._group: dict[str, _Group] = {}
        """namespace -> its quota group (set by ``set_quota``; absent: the namespace is its own group)."""
        self._quota: dict[_Group, int] = {}
        """quota group -> most tokens its namespaces may hold on the host together (absent: no cap but the host's)."""
        self._group_lru: dict[_Group, OrderedDict[int, None]] = {}
        """quota group -> its host pages, least recently used first."""
        self._owner: dict[int, tuple[str, bytes]] = {}
        """host page -> (owner namespace, digest): the owner tag, checked on every lookup."""
        self._lru: OrderedDict[int, None] = OrderedDict()
        """Used host pages, least recently used first."""
        self._stats: dict[str, list[int]] = {}
        """namespace -> [resident, written, loaded] tokens."""
        self.violations = 0
        """Owner-tag mismatches seen on lookup (each one served as a miss)."""
        self.dropped_pages = 0
        """Host pages dropped to make room (global LRU) or to keep a quota group under its cap (its own LRU)."""

    # ----------------------------------------------------------------------------------------------- public API

    def put(self, ns: str, path: Sequence[int], start: int) -> list[tuple[int, int]]:
        """Index the pages of ``path[start:]`` (``path`` = every token from the namespace root).

        Returns ``(token offset in path, host page)`` for each page the caller must now fill from the
        device; pages already on the host are refreshed, not rewritten. Stops early (returns what it
        placed) when the host cannot make room.
        """
        if start % self.page_size:
            raise ValueError(f"start must be page aligned, got {start=} page_size={self.page_size}")
        digests = self.chain(ns, path, len(path) - len(path) % self.page_size)
        index = self._index.setdefault(ns, {})
        out: list[tuple[int, int]] = []
        placed: set[int] = set()
        for i in range(start // self.page_size, len(digests)):
            page = index.get(digests[i])
            if page is not None:
                self._lru.move_to_end(page)
                self._group_pages(ns).move_to_end(page)
                index[digests[i]] = index.pop(digests[i])  # to the end of the namespace's LRU order
                placed.add(page)
                continue
            if not self._within_quota(ns, placed):
                break
            page = self._alloc(placed)
            if page is None:
                break
            placed.add(page)
            index[digests[i]] = page
            self._owner[page] = (ns, digests[i])
            self._lru[page] = None
            self._group_pages(ns)[page] = None
            self._count(ns, resident=self.page_size, written=self.page_size)
            out.append((i * self.page_size, page))
        return out

    def lookup(self, ns: str, tokens: Sequence[int], start: int, digests: Digests | None = None) -> list[int]:
        """Host pages holding ``tokens[start:]`` page by page in ``ns`` (stops at the first miss).

        ``digests``: ``chain``/``lazy_chain`` of ``ns`` and ``tokens`` when the caller already has it.
        """
        if start % self.page_size or not self._index.get(ns):
            return []
        if digests is None:
            digests = self.lazy_chain(ns, tokens)
        index = self._index[ns]
        out: list[int] = []
        for i in range(start // self.page_size, len(digests)):
            digest = digests[i]
            page = index.get(digest)
            if page is None:
                break
            # SECURITY: the owner tag must name the requester; anything else is a miss (fail closed).
            if self._owner.get(page) != (ns, digest):
                self.violations += 1
                logger.warning("isolation-violation op=host-lookup namespace=%s host_page=%d", ns, page)
                break
            out.append(page)
        return out

    def take(self, ns: str, tokens: Sequence[int], start: int, digests: Digests | None = None) -> list[int]:
        """Like :meth:`lookup`, and unindex the pages found: the caller copies them, then :meth:`release`."""
        pages = self.lookup(ns, tokens, start, digests)
        index = self._index.get(ns, {})
        group = self._group_pages(ns)
        for page in pages:
            _, digest = self._owner[page]
            del index[digest]
            self._lru.pop(page, None)
            group.pop(page, None)
        if pages:
            self._count(ns, resident=-len(pages) * self.page_size, loaded=len(pages) * self.page_size)
        return pages

    def release(self, pages: list[int]) -> None:
        """Return pages from :meth:`take` (already copied) to the free list, scrubbed."""
        for page in pages:
            self._owner.pop(page, None)
        self._free_pages(pages)

    def flush(self, ns: str) -> int:
        """Drop every host page of ``ns`` (scrubbed); returns tokens dropped."""
        index = self._index.pop(ns, {})
        pages = list(index.values())
        group = self._group_pages(ns)
        for page in pages:
            self._owner.pop(page, None)
            self._lru.pop(page, None)
            group.pop(page, None)
        if pages:
            self._count(ns, resident=-len(pages) * self.page_size)
        self._free_pages(pages)
        return len(pages) * self.page_size

    def reset(self) -> None:
        """Drop every host page of every namespace (scrubbed). Counters other than residency stay."""
        for ns in list(self._index):
            self.flush(ns)

    def set_quota(self, ns: str, tokens: int | None, *, group: str | None = None) -> None:
        """Cap the host residency of ``ns``'s quota group at ``tokens`` (None: no cap).

        ``group`` (default: ``ns`` alone) names the namespaces that share one cap, e.g. every namespace of one
        tenant; a namespace stays in the group it was first given. The group's own LRU pages above the cap are
        dropped now (scrubbed), never another group's.
        """
        if tokens is not None and tokens < 0:
            raise ValueError(f"quota must be None or >= 0, got {tokens!r}")
        if ns not in self._group:
            name = self._group[ns] = ("ns", ns) if group is None else ("group", group)
            own = self._group_lru.pop(("ns", ns), None)  # pages it placed before it had a group
            if own:
                self._group_lru.setdefault(name, OrderedDict()).update(own)
        name = self._group[ns]
        if tokens is None:
            self._quota.pop(name, None)
            return
        self._quota[name] = tokens
        pages: OrderedDict[int, None] = self._group_lru.get(name, OrderedDict())
        while pages and len(pages) * self.page_size > tokens:
            self._drop(next(iter(pages)))

    def group_resident_tokens(self, ns: str) -> int:
        """Host tokens held by ``ns``'s quota group (all its namespaces)."""
        return len(self._group_lru.get(self._group_of(ns), ())) * self.page_size

    def holds(self, ns: str) -> bool:
        """Whether ``ns`` has any page on the host."""
        return bool(self._index.get(ns))

    def stats(self, ns: str) -> HostStats:
        row = self._stats.get(ns, [0, 0, 0])
        return HostStats(row[0], row[1], row[2])

    def namespaces(self) -> list[str]:
        """Every namespace that has held a host page (in first-seen order)."""
        return list(self._stats)

    def used_pages(self) -> int:
        return self.capacity_pages - len(self._free)

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if the index, owner tags, LRU and free list disagree."""
        indexed = {p: (ns, d) for ns, idx in self._index.items() for d, p in idx.items()}
        assert indexed == self._owner, f"{len(indexed)=} {len(self._owner)=}"
        assert set(self._lru) == set(indexed), f"{len(self._lru)=} {len(indexed)=}"
        assert not set(self._free) & set(indexed), "a free page is indexed"
        assert len(self._free) + len(indexed) == self.capacity_pages, f"{len(self._free)=} {len(indexed)=}"
        grouped = {p: name for name, pages in self._group_lru.items() for p in pages}
        assert set(grouped) == set(indexed), f"{len(grouped)=} {len(indexed)=}"
        for page, (ns, _) in indexed.items():
            assert grouped[page] == self._group_of(ns), f"{page=} {ns=} {grouped[page]=}"
        for ns, idx in self._index.items():
            assert self.stats(ns).resident_tokens == len(idx) * self.page_size, f"{ns=} {self.stats(ns)=}"
        for name, quota in self._quota.items():
            held = len(self._group_lru.get(name, ())) * self.page_size
            assert held <= quota, f"{name=} {quota=} {held=}"

    def lazy_chain(self, ns: str, tokens: Sequence[int]) -> LazyChain:
        """:meth:`chain` over every whole page of ``tokens``, each digest computed on first access."""
        return LazyChain(ns, tokens, self.page_size)

    def chain(self, ns: str, tokens: Sequence[int], length: int) -> list[bytes]:
        """Digest of every whole page of ``tokens[:length]`` chained from ``ns`` (see module doc)."""
        lazy = LazyChain(ns, tokens[:length], self.page_size)
        return [lazy[i] for i in range(len(lazy))]

    # ---------------------------------------------------------------------------------------------- private

    def _alloc(self, keep: set[int]) -> int | None:
        """A free host page, dropping the LRU page if none is free (never one in ``keep``)."""
        if not self._free and self._lru:
            victim = next(iter(self._lru))
            if victim in keep:
                return None
            self._drop(victim)
        return self._free.pop() if self._free else None

    def _within_quota(self, ns: str, keep: set[int]) -> bool:
        """Make room for one more page of ``ns`` under its group's quota (dropping the group's own LRU pages,
        never ``keep``)."""
        quota = self._quota.get(self._group_of(ns))
        if quota is None:
            return True
        pages = self._group_pages(ns)
        while (len(pages) + 1) * self.page_size > quota:
            victim = next(iter(pages), None)
            if victim is None or victim in keep:
                return False
            self._drop(victim)
        return True

    def _group_of(self, ns: str) -> _Group:
        return self._group.get(ns) or ("ns", ns)

    def _group_pages(self, ns: str) -> OrderedDict[int, None]:
        return self._group_lru.setdefault(self._group_of(ns), OrderedDict())

    def _drop(self, page: int) -> None:
        """Remove an indexed page (host full or namespace over quota) and free it, scrubbed."""
        ns, digest = self._owner.pop(page)
        del self._index[ns][digest]
        del self._lru[page]
        del self._group_pages(ns)[page]
        self._count(ns, resident=-self.page_size)
        self.dropped_pages += 1
        self._free_pages([page])

    def _free_pages(self, pages: list[int]) -> None:
        if pages:
            self._scrub_fn(list(pages))
            self._free.extend(pages)

    def _count(self, ns: str, *, resident: int = 0, written: int = 0, loaded: int = 0) -> None:
        row = self._stats.setdefault(ns, [0, 0, 0])
        row[0] += resident
        row[1] += written
        row[2] += loaded
