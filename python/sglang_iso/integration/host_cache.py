"""The tenant cache's host (L2) tier: KV pages evicted from the device, per namespace, scrubbed on free.

Design (why not SGLang's ``HiCacheController``): upstream's hierarchical cache
is built into ``UnifiedRadixCache``. Its nodes carry host values and L3 hashes,
its controller runs asynchronous write/load queues acknowledged through the
tree, with TP-wide consensus, and its L3 keys come from ``extra_key`` /
``cache_salt``. Driving it from our tree would mean re-implementing that node
protocol against an internal, fast-moving API; building on ``UnifiedRadixCache``
would put the namespace boundary back in a structure whose roots are keyed by
client-influenced strings. We keep the tenant tree as the only index and add a
small, synchronous tier of our own:

    device eviction (tree.evict, under pressure only; flush/quota/reset never spill)
        -> spill(owner, path, slots): host pages from HostTier (namespace-chained
           digests, owner tags), device -> host copy, then the device slots are freed
    match_prefix in namespace ns, device prefix p
        -> HostTier.take(ns, tokens, p): host pages that continue the prefix in ns only
        -> device slots allocated (evicting if needed, the matched path locked),
           host -> device copy, pages inserted into ns's tree, owner table told,
           host pages scrubbed and freed; the request sees a longer device prefix

Tiers are exclusive (a page is on the device or the host). Every host page
that leaves the tier (taken, dropped for room, flushed, reset) is zeroed before
reuse. ``--enable-hierarchical-cache`` with ``--hicache-ratio`` /
``--hicache-size`` sizes the host buffers; the scheduler's asynchronous
load-back path is never entered (``host_hit_length`` is always 0).

L3 (:mod:`sglang_iso.integration.l3_store`): with ``--hicache-storage-backend
file`` (taken over by the launcher, see :mod:`sglang_iso.server.hicache_args`)
every page evicted from the device is also written to a page file (unless one
exists) named by a secret-keyed MAC; a match continues host pages with file pages of the same
namespace. Not covered (refused at start: the tree rows of :mod:`sglang_iso.coverage`):
SGLang's own storage backends, host memory mode ``buffer_only``.

Operator-shared prefixes spill too: the declared prefix under its own
namespace ``shared:<name>`` (host index and L3 files of that namespace; no
tenant's quota), a tenant's continuation under the tenant's namespace with the
digest chain starting at the shared prefix's first token. Only a request the
tree routes through the shared prefix (a reader in its scope) looks up
``shared:<name>``; it gets the whole prefix back or nothing, then its own
continuation pages.
"""

from __future__ import annotations

import logging
import time
from array import array
from collections.abc import Callable
from typing import Any

import torch

from sglang_iso.cache.host_tier import Digests, HostTier
from sglang_iso.identity.tags import Namespace
from sglang_iso.integration.l3_store import FileL3Store, page_payload, payload_rows
from sglang_iso.integration.scrub import kv_buffers

logger = logging.getLogger(__name__)

_DEFAULT_RATIO = 2.0

SHARED_L3_OWNER = ":shared"
"""L3 owner of declared shared prefixes: no tenant id starts with ``:``, so no tenant's flush or quota reaches them."""


def l3_owner_of(resolver: Any) -> Callable[[str], str]:
    """The owner (tenant or cache group id) of a namespace for L3 flushes and quotas."""

    def owner(ns: str) -> str:
        namespace = Namespace.parse(ns)
        if namespace is None:
            return "open"
        return SHARED_L3_OWNER if namespace.kind == "shared" else namespace.owner

    return owner


def host_capacity_tokens(server_args: Any, device_tokens: int, bytes_per_token: int) -> int:
    """Host tier size in tokens: ``--hicache-size`` GB when set, else ``--hicache-ratio`` x the device pool."""
    size_gb = float(getattr(server_args, "hicache_size", 0) or 0)
    if size_gb > 0:
        return int(size_gb * (1 << 30)) // max(bytes_per_token, 1)
    ratio = float(getattr(server_args, "hicache_ratio", _DEFAULT_RATIO) or _DEFAULT_RATIO)
    return int(device_tokens * ratio)


class HostCache:
    """Host copies of the device KV buffers plus the per-namespace index; glued to one ``TenantRadixCache``."""

    def __init__(self, cache: Any, capacity_tokens: int) -> None:
        """Raises:
        RuntimeError: the KV pool has no buffers this tier knows how to copy.
        """
        self.cache = cache
        allocator = cache.token_to_kv_pool_allocator
        self.page_size = int(cache.page_size)
        self.device_buffers = kv_buffers(allocator.get_kvcache())
        if not self.device_buffers:
            raise RuntimeError(
                f"sglang-iso: no KV buffers on {type(allocator.get_kvcache()).__name__} for the host tier"
            )
        pages = max(capacity_tokens // self.page_size, 0)
        pin = torch.cuda.is_available()  # NOTE: pinned memory needs CUDA; on CPU the host buffers are plain tensors
        self.host_buffers = [
            torch.zeros((pages * self.page_size, *buf.shape[1:]), dtype=buf.dtype, device="cpu", pin_memory=pin)
            for buf in self.device_buffers
        ]
        self.tier = HostTier(self.page_size, pages, self.scrub_pages)
        self.l3: FileL3Store | None = None  # set by the factory with L3 storage on
        self.scrubbed_pages = 0
        self.load_failures = 0
        self.timing = {"spill_us": 0, "spill_calls": 0, "l3_write_us": 0, "load_us": 0, "load_calls": 0}
        """Time on the scheduler thread (microseconds, wall clock) in the synchronous tier work: spills (device
        -> host copies, L3 writes included and also counted alone) and load-backs past the fast path (lookups,
        L3 reads, host/L3 -> device copies), with their counts."""
        self._ns_counts: dict[str, dict[str, int]] = {}  # namespace -> L3 token counters

    @property
    def page_bytes(self) -> int:
        """Bytes of one page's KV over every buffer (an L3 file's payload)."""
        return sum(self.page_size * buf[0].numel() * buf.element_size() for buf in self.device_buffers)

    # ------------------------------------------------------------------------------------------ tree hooks

    def spill(self, ns: str, path: array, slots: tuple[int, ...]) -> None:
        """Copy an evicted leaf (``slots`` = the last tokens of ``path``) to host pages of ``ns``."""
        t0 = time.perf_counter()
        try:
            self._spill(ns, path, slots)
        finally:
            self.timing["spill_us"] += int((time.perf_counter() - t0) * 1e6)
            self.timing["spill_calls"] += 1

    def _spill(self, ns: str, path: array, slots: tuple[int, ...]) -> None:
        start = len(path) - len(slots)
        placed = self.tier.put(ns, path, start)
        if self.l3 is not None:
            t0 = time.perf_counter()
            self._write_through(ns, path, slots)
            self.timing["l3_write_us"] += int((time.perf_counter() - t0) * 1e6)
        if not placed:
            return
        dev = torch.tensor(
            [slots[off - start + i] for off, _ in placed for i in range(self.page_size)], dtype=torch.int64
        )
        host = self._host_slots([page for _, page in placed])
        dev = dev.to(self.device_buffers[0].device)
        for src, dst in zip(self.device_buffers, self.host_buffers, strict=True):
            dst.index_copy_(0, host, src.index_select(0, dev).to("cpu"))

    def load_back(self, ns: str, tokens: Any, found: Any) -> int:
        """Bring pages continuing ``found`` (the device match in ``ns``) back from host and L3; returns tokens loaded.

        A request that reads a declared shared prefix missing from the device first gets the prefix back (the
        pages of ``shared:<name>``, all of them or none), then its own continuation pages of ``ns``.
        The caller re-matches afterwards. Fails soft: any shortfall (no device room, insert refused) is a miss.
        """
        aligned = len(tokens) - len(tokens) % self.page_size
        if found.prefix_len >= aligned:
            return 0  # NOTE: the common case (full device hit) costs no hashing
        if self.cache.tree.stats(ns).policy == "off":
            return 0  # the tree would refuse the pages
        t0 = time.perf_counter()
        try:
            return self._load_back(ns, tokens, found, aligned)
        finally:
            self.timing["load_us"] += int((time.perf_counter() - t0) * 1e6)
            self.timing["load_calls"] += 1

    def _load_back(self, ns: str, tokens: Any, found: Any, aligned: int) -> int:
        loaded = 0
        route = self.cache.tree.shared_route(ns, tokens) if found.prefix_len == 0 else None
        if route is not None:
            name, length = route
            loaded = self._load_run(Namespace.shared_prefix(name).key, ns, tokens[:length], found, shared=name)
            if not loaded:
                return 0
            found = self.cache.tree.match(ns, tokens, count=False)
            if found.prefix_len >= aligned:
                return loaded
        return loaded + self._load_run(ns, ns, tokens, found)

    def flush(self, ns: str) -> int:
        """Drop ``ns``'s host pages (scrubbed) and make its L3 pages unreachable; returns host tokens dropped."""
        if self.l3 is not None:
            self.l3.flush("ns:" + ns)
        return self.tier.flush(ns)

    def forget_owner(self, owner: str) -> int:
        """Make every L3 page of ``owner`` (``"*"``: of everyone) unreachable, seen since the start or not; returns
        the files deleted (those this store knows)."""
        if self.l3 is None:
            return 0
        return self.l3.flush("*" if owner == "*" else "owner:" + owner)

    def ns_stat_fields(self) -> tuple[str, ...]:
        """The keys :meth:`ns_stats` returns."""
        host = ("host_resident_tokens", "host_loaded_tokens")
        return host if self.l3 is None else (*host, "l3_written_tokens", "l3_loaded_tokens")

    def ns_stats(self, ns: str) -> dict[str, int]:
        """Per-namespace host and L3 counters (tokens) for ``GET /iso/tenants``."""
        hs = self.tier.stats(ns)
        counts = self._ns_counts.get(ns, {})
        out = {"host_resident_tokens": hs.resident_tokens, "host_loaded_tokens": hs.loaded_tokens}
        if self.l3 is not None:
            out["l3_written_tokens"] = counts.get("l3_written_tokens", 0)
            out["l3_loaded_tokens"] = counts.get("l3_loaded_tokens", 0)
        return out

    def owner_stats(self, owner: str) -> dict[str, int]:
        """L3 residency and pruning of ``owner`` (tokens; the store counts per owner, not per namespace)."""
        if self.l3 is None:
            return {}
        pages = self.l3.owner_stats(owner)
        return {
            "l3_resident_tokens": pages["l3_resident_pages"] * self.page_size,
            "l3_pruned_tokens": pages["l3_pruned_pages"] * self.page_size,
        }

    def set_l3_quota(self, owner: str, tokens: int | None) -> None:
        """Cap ``owner``'s L3 tokens (whole pages; None: only the overall cap); its oldest files over it go now."""
        if self.l3 is not None:
            self.l3.set_quota(owner, None if tokens is None else tokens // self.page_size)

    def reset(self) -> None:
        """Drop every host page (scrubbed) and make every L3 page unreachable (``/flush_cache``, weight updates:
        KV computed before may not match the weights after)."""
        self.tier.reset()
        self.forget_owner("*")

    # ------------------------------------------------------------------------------------------ scrub, status

    def scrub_pages(self, pages: list[int]) -> None:
        """Zero host pages (every page leaving the tier passes here before it can be reused)."""
        if not pages:
            return
        host = self._host_slots(pages)
        for buf in self.host_buffers:
            buf.index_fill_(0, host, 0)
        self.scrubbed_pages += len(pages)

    @property
    def logical_size(self) -> int:
        """Host capacity in tokens (read by SGLang's metrics reporter as ``token_to_kv_pool_host``)."""
        return self.tier.capacity_pages * self.page_size

    def available_size(self) -> int:
        """Free host tokens (read by SGLang's metrics reporter)."""
        return (self.tier.capacity_pages - self.tier.used_pages()) * self.page_size

    def status(self) -> dict[str, int]:
        return {
            "host_capacity_tokens": self.tier.capacity_pages * self.page_size,
            "host_used_tokens": self.tier.used_pages() * self.page_size,
            "host_scrubbed_pages": self.scrubbed_pages,
            "host_dropped_pages": self.tier.dropped_pages,
            "host_load_failures": self.load_failures,
            **{f"tier_{name}": value for name, value in self.timing.items()},
            **self._shared_totals(),
            "host_violations": self.tier.violations,
            **({} if self.l3 is None else self.l3.status()),
        }

    # ------------------------------------------------------------------------------------------ private

    def _load_run(self, page_ns: str, ns: str, tokens: Any, found: Any, shared: str | None = None) -> int:
        """Load ``page_ns``'s host and L3 pages continuing ``found`` and insert them for ``ns``; tokens loaded.

        ``shared``: the pages are declared shared prefix ``shared`` (``tokens`` is exactly it): all or nothing.
        """
        tree = self.cache.tree
        start = found.prefix_len
        if self.l3 is None and not self.tier.holds(page_ns):
            return 0  # NOTE: nothing spilled: no hashing
        digests = self.tier.lazy_chain(page_ns, tokens)
        n_host = len(self.tier.lookup(page_ns, tokens, start, digests))
        stored = self._read_l3(page_ns, digests, start // self.page_size + n_host)
        n = (n_host + len(stored)) * self.page_size
        if not n or (shared is not None and start + n != len(tokens)):
            return 0
        pages = self.tier.take(page_ns, tokens, start, digests)
        tree.inc_lock(found.last_node)  # NOTE: evicting for room must not take the prefix being extended
        try:
            slots = self._alloc_device(n)
            if slots is None:
                self.load_failures += 1
                return 0
            self._copy_in(slots, pages, stored)
            values = found.slots.tolist() + slots.tolist()
            result = tree.insert(ns, list(tokens[: start + n]), values)
            leftover = [*result.duplicate_indices, *values[max(result.stored_len, start) :]]
            if leftover:
                self.cache.token_to_kv_pool_allocator.free(torch.tensor(leftover, dtype=torch.int64))
            loaded = max(result.stored_len - start, 0)
            if loaded and self.cache.page_owners is not None:
                if shared is not None:
                    self.cache.page_owners.mark_shared(slots.tolist()[:loaded], shared)
                else:
                    self.cache.page_owners.mark_owned(slots.tolist()[:loaded], ns)
            from_l3 = max(loaded - len(pages) * self.page_size, 0)
            if from_l3:
                self._bump(page_ns, "l3_loaded_tokens", from_l3)
            return loaded
        finally:
            tree.dec_lock(found.last_node)
            self.tier.release(pages)

    def _shared_totals(self) -> dict[str, int]:
        """Host residency and loads of the declared shared prefixes (no tenant's row counts them)."""
        rows = [self.tier.stats(ns) for ns in self.tier.namespaces() if _is_shared(ns)]
        return {
            "host_shared_resident_tokens": sum(r.resident_tokens for r in rows),
            "host_shared_loaded_tokens": sum(r.loaded_tokens for r in rows),
        }

    def _host_slots(self, pages: list[int]) -> torch.Tensor:
        base = torch.tensor(pages, dtype=torch.int64).unsqueeze(1) * self.page_size
        return (base + torch.arange(self.page_size, dtype=torch.int64)).reshape(-1)

    def _write_through(self, ns: str, path: array, slots: tuple[int, ...]) -> None:
        """Write every page of the evicted leaf that L3 lacks (device -> file)."""
        assert self.l3 is not None
        start = len(path) - len(slots)
        digests = self.tier.chain(ns, path, len(path))
        device = self.device_buffers[0].device
        for i in range(start // self.page_size, len(digests)):
            if self.l3.contains(ns, digests[i]):
                continue
            off = i * self.page_size - start
            page = torch.tensor(slots[off : off + self.page_size], dtype=torch.int64, device=device)
            if self.l3.write(ns, digests[i], page_payload(self.device_buffers, page)):
                self._bump(ns, "l3_written_tokens", self.page_size)

    def _read_l3(self, ns: str, digests: Digests, first_page: int) -> list[bytes]:
        """Authentic L3 payloads of ``ns``'s pages from ``first_page`` on, up to the first miss."""
        if self.l3 is None:
            return []
        out: list[bytes] = []
        for i in range(first_page, len(digests)):
            payload = self.l3.read(ns, digests[i])
            if payload is None:
                break
            out.append(payload)
        return out

    def _copy_in(self, slots: torch.Tensor, host_pages: list[int], stored: list[bytes]) -> None:
        """Fill device ``slots``: first the host pages, then the L3 payloads, page by page."""
        dev = slots.to(self.device_buffers[0].device)
        n_host = len(host_pages) * self.page_size
        if host_pages:
            host = self._host_slots(host_pages)
            for dst, src in zip(self.device_buffers, self.host_buffers, strict=True):
                dst.index_copy_(0, dev[:n_host], src.index_select(0, host).to(dst.device))
        if stored:
            per_page = [payload_rows(self.device_buffers, p, self.page_size) for p in stored]
            for b, dst in enumerate(self.device_buffers):
                rows = torch.cat([page[b] for page in per_page]).to(dst.device)
                dst.index_copy_(0, dev[n_host:], rows)

    def _bump(self, ns: str, field: str, n: int) -> None:
        row = self._ns_counts.setdefault(ns, {})
        row[field] = row.get(field, 0) + n

    def _alloc_device(self, n: int) -> torch.Tensor | None:
        allocator = self.cache.token_to_kv_pool_allocator
        if allocator.available_size() < n:
            self.cache.tree.evict(n - allocator.available_size())
        if allocator.available_size() < n:
            return None
        slots = allocator.alloc(n)
        return None if slots is None else slots.to(torch.int64)


def _is_shared(ns: str) -> bool:
    namespace = Namespace.parse(ns)
    return namespace is not None and namespace.kind == "shared"
