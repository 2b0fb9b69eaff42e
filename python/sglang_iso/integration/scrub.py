"""Scrub-on-free: freed KV pages are zeroed before anyone can be handed them again.

Installed on the allocator instance the tenant cache receives (not only on tree
eviction), through its :mod:`~sglang_iso.integration.allocator_tap`, so all free
paths are covered: tree eviction, duplicate slots after insert, request release
and tenant flush all end in the allocator's release.

    allocator release (page 1: ``free``; paged: ``_release_page_ids``)
        -> page ids recorded as pending, then released as upstream does
    allocator hand-out (``alloc``, ``alloc_extend``, ``alloc_decode``)
        -> every pending page is zeroed in one batched call first

Batching at hand-out gives one scrub per scheduler step however many frees it
made, and guarantees the order "scrubbed before allocated again". On CUDA the
scrub first waits for the forward stream, so no kernel still reading a freed
page races with its zeroing (overlap scheduler). Freed request rows of
``req_to_token`` are reset to the padding slot at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from sglang_iso import coverage
from sglang_iso.coverage import NotCoveredError
from sglang_iso.integration import allocator_tap
from sglang_iso.integration.allocator_tap import Order

if TYPE_CHECKING:
    from sglang_iso_kernels import HostScrubber

logger = logging.getLogger(__name__)

_BUFFER_ATTRS = ("k_buffer", "v_buffer", "k_scale_buffer", "v_scale_buffer", "kv_buffer", "kv_scale_buffer")
_METADATA_ATTRS = frozenset({"data_ptrs", "k_data_ptrs", "v_data_ptrs", "data_strides"})
"""Per-layer addresses and strides of the buffers above: no tenant data."""
_ALLOC_METHODS = ("alloc", "alloc_extend", "alloc_decode")
_PAGE_ROW_CACHES = {"index_key_cache": "buffer"}
"""Pool attribute -> the attribute of that object holding one ``[pages, ...]`` tensor per layer."""
_REQUEST_ROW_ATTRS = ("_compress_tail_k", "_compress_tail_score")
"""Pool attributes holding one ``[req_to_token rows + 1, ...]`` tensor per layer."""


_SWA_INDEX_ATTRS = frozenset({"full_to_swa_index_mapping"})
"""An SWA hybrid pool's copy of its allocator's full -> SWA slot map: slot numbers, no tenant data."""


class PoolTensors(NamedTuple):
    """Every tensor of tenant data in a KV pool, by the row a free must zero."""

    slots: list[torch.Tensor]
    """``[slots, ...]``: rows ``p*page_size .. p*page_size + page_size - 1`` of a freed page ``p``."""
    pages: list[torch.Tensor]
    """``[pages, ...]``: row ``p`` of a freed page ``p`` (empty layers left out)."""
    requests: list[torch.Tensor]
    """``[request rows, ...]``: row ``r`` of a freed ``req_to_token`` row ``r`` (empty layers left out)."""

    def joined(self, other: PoolTensors) -> PoolTensors:
        return PoolTensors([*self.slots, *other.slots], [*self.pages, *other.pages], [*self.requests, *other.requests])

    def total(self) -> int:
        return len(self.slots) + len(self.pages) + len(self.requests)


class KvScrubber:
    """Zeroes freed pages of one allocator's KV pool. Single-threaded (scheduler thread)."""

    def __init__(self, allocator: Any, req_to_token_pool: Any, forward_stream: Any = None) -> None:
        """Raises:
        NotCoveredError: the pool has none of the known buffer attributes, keeps page-row tensors at another
            page size than the allocator's, or request-row tensors shorter than the row table.
        """
        self.allocator = allocator
        self.req_to_token_pool = req_to_token_pool
        self.page_size = int(allocator.page_size)
        self.forward_stream = forward_stream
        kvcache = allocator.get_kvcache()
        self.tensors = pool_tensors(kvcache)
        if not self.tensors.slots:
            raise NotCoveredError(f"no KV buffers found on {type(kvcache).__name__}")
        if self.tensors.pages and int(getattr(kvcache, "page_size", 0)) != self.page_size:
            raise NotCoveredError(
                f"{type(kvcache).__name__} keeps page-indexed tensors but its page size differs from the "
                f"allocator's ({getattr(kvcache, 'page_size', None)} vs {self.page_size})"
            )
        self._check_request_rows(self.tensors)
        self._host = _host_scrubbers(self.tensors, self.page_size)
        self.pending: list[torch.Tensor] = []  # page ids released but not yet zeroed
        self.scrubbed_pages = 0  # pages zeroed so far: each hand-out's distinct pages (freed again later: again)
        self.scrub_calls = 0
        self.reset_rows = 0
        self.draft_buffers = 0  # how many of ``buffers`` belong to a draft model's pool

    def install(self) -> KvScrubber:
        """Subscribe to the allocator's release and hand-out and the request pool's row release
        (:mod:`~sglang_iso.integration.allocator_tap`, innermost: it sees what the other layers release)."""
        alloc = self.allocator
        paged = allocator_tap.is_paged(alloc)
        tap = allocator_tap.tap_of(alloc)
        tap.subscribe(allocator_tap.RELEASE, Order.SCRUB, self._release_paged if paged else self._free)
        for name in _ALLOC_METHODS:
            if hasattr(alloc, name):
                tap.subscribe(name, Order.SCRUB, self._flush_before)
        pool = self.req_to_token_pool
        if pool is not None and hasattr(pool, "free_rows"):
            allocator_tap.tap_of(pool).subscribe("free_rows", Order.SCRUB, self._reset_rows)
        logger.info(
            "sglang-iso: scrub-on-free installed on %s.%s (%d slot, %d page, %d request tensors, page size %d)",
            type(alloc).__name__,
            allocator_tap.allocator_release_name(alloc),
            len(self.tensors.slots),
            len(self.tensors.pages),
            len(self.tensors.requests),
            self.page_size,
        )
        return self

    def add_pool(self, tensors: PoolTensors) -> None:
        """Zero these tensors too on every scrub: a draft model's KV pool, which indexes the same slots and
        request rows through the same allocator and row table (``integration/spec_draft.py``).

        Raises:
            NotCoveredError: a request-row tensor has fewer rows than the row table.
        """
        self._check_request_rows(tensors)
        self.tensors = self.tensors.joined(tensors)
        self._host = _host_scrubbers(self.tensors, self.page_size)
        self.draft_buffers += tensors.total()

    def flush(self) -> int:
        """Zero every pending page now; returns the number of pages zeroed."""
        if not self.pending:
            return 0
        if self._host is not None and all(p.device.type == "cpu" for p in self.pending):
            # NOTE: numpy, single-threaded, the buffers viewed once (sglang_iso_kernels.scrub.HostScrubber): this
            # runs before every hand-out.
            released = np.concatenate([p.numpy() for p in self.pending]).astype(np.int64)
            self.pending = []
            slots, pages_only = self._host
            count = slots.zero(released)
            if pages_only is not None:
                pages_only.zero(released)
            self.scrubbed_pages += count
            self.scrub_calls += 1
            return count
        pages = torch.unique(torch.cat(self.pending).to(torch.int64))  # (a device pool; the host route is above)
        self.pending = []
        if pages.is_cuda and self.forward_stream is not None:
            # NOTE: a forward still reading these pages must finish before they are zeroed.
            torch.cuda.current_stream().wait_stream(self.forward_stream)
        zero_pages(self.tensors, pages, self.page_size)
        self.scrubbed_pages += int(pages.numel())
        self.scrub_calls += 1
        return int(pages.numel())

    def _check_request_rows(self, tensors: PoolTensors) -> None:
        table = getattr(self.req_to_token_pool, "req_to_token", None)
        rows = 0 if table is None else int(table.shape[0])
        short = [tuple(b.shape) for b in tensors.requests if b.shape[0] < rows]
        if tensors.requests and (table is None or short):
            raise NotCoveredError(f"request-row KV tensors {short} do not cover the {rows} rows of req_to_token")

    def status(self) -> dict[str, int]:
        return {
            "scrubbed_pages": self.scrubbed_pages,
            "scrub_calls": self.scrub_calls,
            "pending_pages": sum(int(p.numel()) for p in self.pending),
            "reset_rows": self.reset_rows,
            "draft_buffers": self.draft_buffers,
        }

    # ------------------------------------------------------------------ tap layers
    def _free(self, below: Any, free_index: torch.Tensor) -> None:
        if free_index.numel() and self.allocator.free_group is None:
            self.pending.append(free_index.detach().clone())
        below(free_index)

    def _release_paged(self, below: Any, *page_ids: torch.Tensor) -> None:
        self.pending.extend(p.detach().clone() for p in page_ids if p.numel())
        below(*page_ids)

    def _flush_before(self, below: Any, *args: Any, **kwargs: Any) -> Any:
        self.flush()
        return below(*args, **kwargs)

    def _reset_rows(self, below: Any, indices: Any) -> None:
        rows = [int(i) for i in indices]
        if rows:
            # Slot 0 is the padding sink: a reset row points nowhere real.
            table = self.req_to_token_pool.req_to_token
            if table.device.type == "cpu":
                # NOTE: a numpy view: torch's indexed store opens a thread-parallel region, which costs
                # milliseconds per freed row on a host whose cores are busy with the forward.
                table.numpy()[rows] = 0
            else:
                table[rows] = 0
            zero_request_rows(self.tensors, rows)
            self.reset_rows += len(rows)
        below(indices)


class SwaScrubber:
    """Scrub-on-free for an SWA hybrid pool (SGLang's ``SWAKVPool`` under a ``SWATokenToKVPoolAllocator``).

    The hybrid allocator hands out and releases through two allocators of its own, each over its own sub-pool:
    the full-attention layers' slots and the sliding-window layers' slots (joined by ``full_to_swa_index_mapping``).
    Each gets a :class:`KvScrubber` of its own, subscribed to that sub-allocator, so every SWA release is covered
    whatever path it takes: a tree eviction or request release (``free`` = ``free_swa`` + ``free_full``), SGLang's
    out-of-window frees of running requests (``free_swa_segment``, which bypasses the tree) and grouped frees
    (``free_group_end``). Request rows are reset by the full side's scrubber. Single-threaded (scheduler thread).
    """

    def __init__(self, allocator: Any, req_to_token_pool: Any, forward_stream: Any = None) -> None:
        """Raises:
        NotCoveredError: a per-request SWA ring (its slots are owned by request rows, not released through the
            SWA allocator), or a sub-pool the plain scrubber does not cover.
        """
        if getattr(allocator, "_swa_req_ring", False):
            raise NotCoveredError(f"{type(allocator).__name__} with a per-request SWA ring")
        kvcache = allocator.get_kvcache()
        extra = uncovered_swa_tensors(kvcache)
        if extra:
            raise NotCoveredError(f"tensors scrub-on-free does not zero: {', '.join(sorted(extra))}")
        self.allocator = allocator
        self.full = KvScrubber(allocator.full_attn_allocator, req_to_token_pool, forward_stream)
        self.swa = KvScrubber(allocator.swa_attn_allocator, None, forward_stream)

    def install(self) -> SwaScrubber:
        """Subscribe each side's scrubber to its sub-allocator (the full side also to the row pool)."""
        self.full.install()
        self.swa.install()
        return self

    @property
    def scrubbed_pages(self) -> int:
        return self.full.scrubbed_pages + self.swa.scrubbed_pages

    def flush(self) -> int:
        """Zero every pending page of both sub-pools now; returns the number of pages zeroed."""
        return self.full.flush() + self.swa.flush()

    def add_pool(self, tensors: PoolTensors) -> None:
        """Raises:
        NotCoveredError: always; a draft model's pool beside an SWA hybrid pool is not covered.
        """
        raise NotCoveredError("a speculative draft model's KV pool beside an SWA hybrid pool")

    def status(self) -> dict[str, int]:
        full, swa = self.full.status(), self.swa.status()
        return {
            **{key: full[key] + swa[key] for key in ("scrubbed_pages", "scrub_calls", "pending_pages")},
            "reset_rows": full["reset_rows"],
            "draft_buffers": 0,
            "swa_scrubbed_pages": swa["scrubbed_pages"],
        }


def make_scrubber(allocator: Any, req_to_token_pool: Any, forward_stream: Any = None) -> KvScrubber | SwaScrubber:
    """The scrubber for ``allocator``'s pool, installed: one per sub-pool for an SWA hybrid allocator.

    Raises:
        NotCoveredError: a pool (or sub-pool) whose tensors scrub-on-free does not know.
    """
    if is_swa_allocator(allocator):
        return SwaScrubber(allocator, req_to_token_pool, forward_stream).install()
    return KvScrubber(allocator, req_to_token_pool, forward_stream).install()


def is_swa_allocator(allocator: Any) -> bool:
    """An SWA hybrid allocator: two sub-allocators joined by a full -> SWA index map."""
    return all(
        hasattr(allocator, a) for a in ("full_attn_allocator", "swa_attn_allocator", "full_to_swa_index_mapping")
    )


def uncovered_swa_tensors(kvcache: Any) -> frozenset[str]:
    """:func:`uncovered_tensors` of an SWA hybrid pool: each sub-pool's, and any tensor the hybrid pool keeps
    beside them."""
    subs = ("full_kv_pool", "swa_kv_pool")
    missing = frozenset(f"{type(kvcache).__name__}.{a}" for a in subs if getattr(kvcache, a, None) is None)
    known = {*subs, *_METADATA_ATTRS, *_SWA_INDEX_ATTRS}
    own = frozenset(
        f"{type(kvcache).__name__}.{attr}"
        for attr, value in vars(kvcache).items()
        if attr not in known and _holds_tensor(value, nested=True)
    )
    inner = frozenset(
        t for a in subs if getattr(kvcache, a, None) is not None for t in uncovered_tensors(getattr(kvcache, a))
    )
    return missing | own | inner


def unscrubbed_tensors(kvcache: Any) -> frozenset[str]:
    """What scrub-on-free would leave unzeroed in ``kvcache``: :func:`uncovered_swa_tensors` for an SWA hybrid
    pool, :func:`uncovered_tensors` for any other."""
    if hasattr(kvcache, "full_kv_pool") and hasattr(kvcache, "swa_kv_pool"):
        return uncovered_swa_tensors(kvcache)
    return uncovered_tensors(kvcache)


_LINEAR_HYBRID_PARTS = ("full_kv_pool", "mamba_pool")
"""A linear-attention hybrid pool's parts: the attention layers' KV pool (scrubbed as any KV pool) and the recurrent
state pool (zeroed by :class:`~sglang_iso.integration.mamba_scrub.MambaScrubber` on the row pool's slot allocator)."""


def _is_linear_hybrid(kvcache: Any) -> bool:
    """A linear-attention hybrid pool (``HybridLinearKVPool``): attention KV in ``full_kv_pool`` beside a state pool."""
    return hasattr(kvcache, "full_kv_pool") and hasattr(kvcache, "mamba_pool") and not hasattr(kvcache, "swa_kv_pool")


def attention_kv_pool(kvcache: Any) -> Any:
    """The pool holding attention KV by token slot: the attention part of a linear-attention hybrid, else itself."""
    return kvcache.full_kv_pool if _is_linear_hybrid(kvcache) else kvcache


def _host_scrubbers(tensors: PoolTensors, page_size: int) -> tuple[HostScrubber, HostScrubber | None] | None:
    """Host scrubbers of the slot-row and page-row tensors when every one of them is on the host, else None."""
    if not all(t.device.type == "cpu" for t in (*tensors.slots, *tensors.pages)):
        return None
    from sglang_iso_kernels import HostScrubber

    return HostScrubber(tensors.slots, page_size), HostScrubber(tensors.pages, 1) if tensors.pages else None


def zero_pages(tensors: PoolTensors, pages: torch.Tensor, page_size: int) -> None:
    """Zero pages ``pages`` (int64 page ids) in every slot-row and page-row tensor."""
    from sglang_iso_kernels import scrub_pages

    scrub_pages(tensors.slots, pages, page_size)
    if tensors.pages:
        scrub_pages(tensors.pages, pages, 1)


def zero_request_rows(tensors: PoolTensors, rows: list[int]) -> None:
    """Zero rows ``rows`` of every request-row tensor."""
    if not tensors.requests:
        return
    index = torch.tensor(rows, dtype=torch.int64, device=tensors.requests[0].device)
    for buf in tensors.requests:
        buf.index_fill_(0, index, 0)


def kv_buffers(kvcache: Any) -> list[torch.Tensor]:
    """Every per-layer K, V, scale and MLA buffer of a KV pool, as ``[slots, ...]`` tensors."""
    kvcache = attention_kv_pool(kvcache)
    out: list[torch.Tensor] = []
    for attr in _BUFFER_ATTRS:
        value = getattr(kvcache, attr, None)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, list | tuple):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def pool_tensors(kvcache: Any) -> PoolTensors:
    """Every tensor of tenant data in a KV pool whose layout scrub-on-free knows.

    Tensors outside these layouts are listed by :func:`uncovered_tensors`, and the pool is refused.
    """
    kvcache = attention_kv_pool(kvcache)
    pages = [b for attr in _covered_page_caches(kvcache) for b in _page_row_buffers(kvcache, attr) or []]
    requests = [
        b for attr in _covered_request_attrs(kvcache) for b in getattr(kvcache, attr, None) or [] if b.shape[0] > 0
    ]
    return PoolTensors(kv_buffers(kvcache), [b for b in pages if b.shape[0] > 0], requests)


def uncovered_tensors(kvcache: Any) -> frozenset[str]:
    """``Class.attribute`` of every tensor a KV pool holds that scrub-on-free does not zero.

    Everything but the buffers :func:`kv_buffers` returns and their address tables counts, in the pool and
    one level into SGLang objects it holds (an index-key cache, a compress tail), so a pool that gains a
    tensor in a new SGLang version is refused at start instead of keeping tenant data past a free. A linear-attention
    hybrid pool counts its attention part's (of a served pool class) and anything beside its two parts.
    """
    if _is_linear_hybrid(kvcache):
        name = type(kvcache).__name__
        extra = frozenset(
            f"{name}.{attr}"
            for attr, value in vars(kvcache).items()
            if attr not in _LINEAR_HYBRID_PARTS and _holds_tensor(value, nested=True)
        )
        inner = type(kvcache.full_kv_pool).__name__
        if inner not in coverage.COVERED_POOLS:  # an attention part outside the served pool classes
            extra |= {f"{name}.full_kv_pool ({inner})"}
        return extra | uncovered_tensors(kvcache.full_kv_pool)
    name = type(kvcache).__name__
    covered = {*_BUFFER_ATTRS, *_METADATA_ATTRS, *_covered_page_caches(kvcache), *_covered_request_attrs(kvcache)}
    return frozenset(
        f"{name}.{attr}"
        for attr, value in vars(kvcache).items()
        if attr not in covered and _holds_tensor(value, nested=True)
    )


def _covered_page_caches(kvcache: Any) -> list[str]:
    return [attr for attr in _PAGE_ROW_CACHES if _page_row_buffers(kvcache, attr) is not None]


def _page_row_buffers(kvcache: Any, attr: str) -> list[torch.Tensor] | None:
    """The per-layer ``[pages, ...]`` tensors of ``kvcache.<attr>``, or None when their layout is not the
    known one: the holder keeps no other tensor, one row per pool page of ``page_size`` tokens (DSA's
    index keys: no decode-context-parallel split), and enough rows for every page of the pool."""
    holder = getattr(kvcache, attr, None)
    field = _PAGE_ROW_CACHES[attr]
    buffers = getattr(holder, field, None)
    if holder is None or not isinstance(buffers, list):
        return None
    others = (v for k, v in vars(holder).items() if k != field)
    if any(_holds_tensor(v, nested=False) for v in others):
        return None
    page_size = int(getattr(kvcache, "page_size", 0) or 0)
    if page_size < 1 or getattr(kvcache, "index_page_size", 0) * getattr(kvcache, "index_kpool", 0) != page_size:
        return None
    pages = int(kvcache.size) // page_size + 1
    for buf in buffers:
        if not isinstance(buf, torch.Tensor) or buf.dim() != 2 or 0 < buf.shape[0] < pages:
            return None
    return buffers


def _covered_request_attrs(kvcache: Any) -> list[str]:
    """The request-row attributes present with a known layout: None, or a list of ``[rows, ...]`` tensors."""
    out = []
    for attr in _REQUEST_ROW_ATTRS:
        value = getattr(kvcache, attr, None)
        if value is None or (isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value)):
            out.append(attr)
    return out


def _holds_tensor(value: Any, *, nested: bool) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, list | tuple):
        return any(_holds_tensor(v, nested=nested) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v, nested=nested) for v in value.values())
    if nested and type(value).__module__.startswith("sglang.") and hasattr(value, "__dict__"):
        return any(_holds_tensor(v, nested=False) for v in vars(value).values())
    return False
