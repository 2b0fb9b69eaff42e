"""Page ownership at attention time: a wrong index in a request's row reads zeros, never a neighbour's KV.

The tree decides what a request may reuse; this is the second line of defence
for when the code around it is wrong (a stale or planted index in
``req_to_token``). Tables, kept in the scheduler process on the pool's device:

    page_owner[page]   int32  owner slot of each KV page; FREE (-1) after release
    row_owner[row]     int32  owner slot of the request holding each req_to_token row
    allowed[slot, k]   int32  slots owner ``slot`` may read besides its own (the zero page's slot and
                              the shared prefixes it is declared for), -1 padded
    owner slots        one small int per tree namespace (and per declared shared prefix)

Before every ``ModelRunner.forward``, whatever the attention backend: every
backend (FlashInfer, Triton, FlashAttention, torch_native, eager or CUDA graph
replay) reads a request's KV slots from its ``req_to_token`` row, so the rows
are sanitized in place first, for the whole batch in one pass
(``sanitize_rows`` from ``sgl-kernel-patches``: Triton on GPU, torch on CPU; on
CPU a plain pool's batch is first tried from host lists, ``clean_rows_host``, which
decides a batch whose every slot is its row's own or readable and hands anything
else to the full pass; a decode step is first tried from what that route verified of
each row, ``verified_rows.DecodeRoute``: the new column read, the old ones compared with
a copy, valid until a page in its checked columns changes owner other than by adoption).
The pages a request writes in this step are adopted if FREE or already its
own; every other slot of its row window must be its own, a shared prefix it may
read, or the zero page. Anything else is replaced by the dedicated zero page
(reserved at start, zeroed, never written, never freed). The pass costs the
batch's tokens, not the pool size, and does not sync with the host: per-request
counts are copied back asynchronously and read when the batch's results are
processed, where the violation is counted, logged, and the request aborted.

A speculative verify pass (``TARGET_VERIFY``) is checked over the committed
tokens and the drafts' window after them (the drafts' pages are adopted). Draft
passes of a draft model (STANDALONE) plan attention before their forward, so
their rows are sanitized earlier, at the speculative worker's entry, through
:meth:`OwnerTable.check_window` (``integration/spec_draft.py``). Not covered
(refused at start: the owner-check rows of :mod:`sglang_iso.coverage`): other draft-model algorithms
and diffusion LLM decoding plan attention metadata outside the checked points;
PD decode workers fill pages by transfer, which no forward adopts.
"""

from __future__ import annotations

import collections
import logging
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from sglang_iso.identity.tags import Namespace
from sglang_iso.integration import allocator_tap, runtime
from sglang_iso.integration.allocator_tap import Order
from sglang_iso_kernels import clean_rows_host, sanitize_rows
from sglang_iso_kernels.verified_rows import DecodeRoute, VerifiedWindows

if TYPE_CHECKING:
    from sglang_iso.integration.scrub import PoolTensors
    from sglang_iso.integration.state_owner import StateOwners
    from sglang_iso.integration.swa_owner import SwaOwners

logger = logging.getLogger(__name__)

FREE = allocator_tap.FREE_PAGE
UNTAGGED = 0  # requests without a verified namespace: they never share, so one slot for all is enough
_INITIAL_SLOTS = 1024  # owner slots the allowed table holds before it grows
_MAX_PENDING = 64  # undrained per-forward results kept before the oldest are read back


def check_before_forward(model_runner: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``ModelRunner.forward``: sanitize the batch's rows once per forward, for every backend."""
    # NOTE: only batches over this cache's rows (a STANDALONE draft runner shares them and is checked too);
    # a draft runner with a compact table of its own is refused at start (spec_draft.attach_draft_pools).
    table = runtime.owner_table()
    if (
        table is not None
        and getattr(forward_batch, "req_pool_indices", None) is not None
        and getattr(model_runner, "req_to_token_pool", None) is table.cache.req_to_token_pool
    ):
        table.check_batch(forward_batch)


def abort_before_results(scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.process_batch_result``: requests that hit a violation finish as aborted."""
    table = runtime.owner_table()
    if table is not None and batch is not None:
        table.abort_violators(batch)


class _Pending(NamedTuple):
    """One forward's check result on its way back to the host."""

    counts: torch.Tensor  # [2, B] int32 host (pinned on CUDA): row ids, refused slots per request (a third row:
    # refused recurrent-state slots, for a hybrid row pool on a device)
    done: Any  # torch.cuda.Event recorded after the copy, or None when already on the host


class _HostViews(NamedTuple):
    """Numpy views of the host route's tables (same memory), the row table they were made from, and the decode
    route bound to them (None without a memory)."""

    table: torch.Tensor
    req_to_token: np.ndarray
    row_owner: np.ndarray
    page_owner: np.ndarray
    route: DecodeRoute | None

    @classmethod
    def of(cls, req_to_token: torch.Tensor, owners: OwnerTable) -> _HostViews:
        table, row_owner, page_owner = req_to_token.numpy(), owners.row_owner.numpy(), owners.page_owner.numpy()
        route = None
        if owners._verified is not None:
            try:
                route = DecodeRoute(owners._verified, table, row_owner, page_owner)
            except ValueError as exc:
                logger.warning("sglang-iso: owner check: every decode step is read in full: %s", exc)
        return cls(req_to_token, table, row_owner, page_owner, route)


class OwnerTable:
    """Owner slots of pages and rows for one KV pool. Scheduler thread only."""

    def __init__(self, cache: Any) -> None:
        from sglang_iso.integration.swa_owner import is_swa_sub_pool

        self.cache = cache
        allocator = cache.token_to_kv_pool_allocator
        self.swa_layout = is_swa_sub_pool(allocator)
        # NOTE: in SGLang's SWA sub-pool layout the rows hold full-pool slots: that sub-allocator is the pool here.
        self.kv_allocator = allocator.full_attn_allocator if self.swa_layout else allocator
        self.page_size = int(allocator.page_size)
        device = cache.device
        num_pages = int(self.kv_allocator.size) // self.page_size + 2
        self.page_owner = torch.full((num_pages,), FREE, dtype=torch.int32, device=device)
        rows = cache.req_to_token_pool.req_to_token.shape[0]
        self.row_owner = torch.full((rows,), FREE, dtype=torch.int32, device=device)
        self._row_req: dict[int, weakref.ReferenceType[Any]] = {}
        self._slots: dict[str, int] = {}
        self._namespaces: dict[int, str] = {}  # slot -> namespace (reverse of _slots)
        self._allowed_rows: set[int] = set()  # owner slots whose ``allowed`` row is filled
        self.allowed = torch.full((_INITIAL_SLOTS, 1), FREE, dtype=torch.int32, device=device)
        # NOTE: outgrown tables stay alive because a forward still queued on the device may read them.
        self._retired: list[torch.Tensor] = []
        self._pending: collections.deque[_Pending] = collections.deque()
        self.violations = 0
        self.violations_by_owner: dict[str, int] = {}
        """Refused slots by the namespace owner (tenant or group; ``"open"`` without one) whose row held them."""
        self.violating_rows: set[int] = set()
        self.draft_buffers: list[torch.Tensor] = []  # a draft model's slot-row KV buffers (spec_draft.py)
        self.draft_page_buffers: list[torch.Tensor] = []  # its page-row tensors (DSA index keys)
        self.draft_step_checks = 0  # speculative decode steps checked before any draft planning
        self.zero_owner = self.slot_of("sglang-iso/zero-page")
        self.allowed[:, 0] = self.zero_owner  # everyone may read the zero page
        self.zero_page = self._reserve_zero_page()
        self.state: StateOwners | None = None  # recurrent-state slots of a hybrid linear-attention row pool
        self.swa: SwaOwners | None = None  # sliding-window pages of an SWA hybrid pool in the sub-pool layout
        if self.swa_layout:
            from sglang_iso.integration.swa_owner import SwaOwners

            window = getattr(cache, "swa_retain_window", None)  # (the model's window, or wider)
            if not window:
                raise RuntimeError("sglang-iso: an SWA sub-pool without a sliding window size")
            self.swa = SwaOwners(allocator, int(window), self.zero_owner)
            self.swa.map_zero(self.zero_page)
        rows_pool = cache.req_to_token_pool
        if getattr(rows_pool, "mamba_pool", None) is not None:
            from sglang_iso.integration.state_owner import StateOwners

            self.state = StateOwners(rows_pool)
        # NOTE: a plain KV pool on the host is checked from host lists first (``_clean_on_host``); the recurrent
        # state and sliding-window checks of the hybrid pools run after the full pass only.
        self._host_route = (
            self.page_owner.device.type == "cpu"
            and rows_pool.req_to_token.device.type == "cpu"
            and self.state is None
            and self.swa is None
            and rows_pool.req_to_token.dtype == torch.int32
        )
        # NOTE: what the host route verified of each row, so a decode step reads its new column only
        # (sglang_iso_kernels.verified_rows); every page-owner change below but adoption is announced to it.
        width = int(rows_pool.req_to_token.shape[1])
        self._verified = VerifiedWindows(rows, width, num_pages, self.page_size) if self._host_route else None
        # (told the pages each release makes FREE; None off the host route, so a device release never syncs)
        self._announce = self._verified.changed if self._verified is not None else None
        # NOTE: numpy views of the host route's three tables, made once (they share memory); a decode step reads
        # them before every forward.
        self._host_views = _HostViews.of(rows_pool.req_to_token, self) if self._host_route else None

    def _reserve_zero_page(self) -> int:
        """Take one page from the allocator for good and zero it; reads of refused slots land here."""
        slots = self.kv_allocator.alloc(self.page_size)
        if slots is None:
            raise RuntimeError("sglang-iso: could not reserve the zero page for the owner check")
        page = int(slots[0]) // self.page_size
        self._zero(page)
        self.page_owner[page] = self.zero_owner
        return page

    def _zero(self, page: int) -> None:
        """Zero ``page`` in every page-indexed tensor of the target and draft pools."""
        from sglang_iso.integration.scrub import PoolTensors, pool_tensors, zero_pages

        tensors = pool_tensors(self.kv_allocator.get_kvcache())
        tensors = tensors.joined(PoolTensors(self.draft_buffers, self.draft_page_buffers, []))
        zero_pages(tensors, torch.tensor([page], dtype=torch.int64, device=self.page_owner.device), self.page_size)

    # ------------------------------------------------------------------ wiring
    def install(self) -> OwnerTable:
        """Subscribe to the allocator's release and clear and the row pool's alloc and free_rows
        (:mod:`~sglang_iso.integration.allocator_tap`: inside the PD quarantine, outside the scrubber)."""
        alloc = self.cache.token_to_kv_pool_allocator
        allocator_tap.tap_of(alloc).subscribe("clear", Order.OWNER, self._clear)
        paged = allocator_tap.is_paged(self.kv_allocator)
        allocator_tap.tap_of(self.kv_allocator).subscribe(
            allocator_tap.RELEASE, Order.OWNER, self._release_paged if paged else self._free
        )
        if self.swa is not None:
            sub = allocator_tap.tap_of(self.swa.sub)
            sub.subscribe(
                allocator_tap.RELEASE,
                Order.OWNER,
                self.swa.release_paged if allocator_tap.is_paged(self.swa.sub) else self.swa.release_slots,
            )
            allocator_tap.tap_of(alloc).subscribe("clear_full_to_swa_mapping", Order.OWNER, self.swa.restore_map)
        rows = allocator_tap.tap_of(self.cache.req_to_token_pool)
        rows.subscribe("alloc", Order.OWNER, self._alloc_rows)
        rows.subscribe("free_rows", Order.OWNER, self._free_rows)
        if self.state is not None:
            state_tap = allocator_tap.tap_of(self.cache.req_to_token_pool.mamba_allocator)
            state_tap.subscribe("clear", Order.OWNER, self.state.reserve_again)
        logger.info(
            "sglang-iso: KV owner check installed (zero page %d%s)",
            self.zero_page,
            "" if self.state is None else f", zero state slot {self.state.zero_slot}",
        )
        if self.swa is not None:
            logger.info("sglang-iso: sliding-window sub-pool owner check (zero page %d)", self.swa.zero_page)
        return self

    # ------------------------------------------------------------------ tap layers
    def _clear(self, below: Any) -> None:
        # A cleared pool frees every page, the zero page too: take a fresh one.
        below()
        self.page_owner.fill_(FREE)
        self._forget_all()
        self.zero_page = self._reserve_zero_page()
        if self.swa is not None:
            self.swa.reset(self.zero_page)

    def _forget_all(self) -> None:
        if self._verified is not None:
            self._verified.forget_all()

    def _changed(self, pages: torch.Tensor) -> None:
        """Host ``pages`` change owner: announced to the host route's memory (a no-op without it)."""
        if self._announce is not None:
            self._announce(pages.numpy())

    def _release_paged(self, below: Any, *page_ids: torch.Tensor) -> Any:
        return allocator_tap.release_pages(self.page_owner, self.zero_page, below, *page_ids, released=self._announce)

    def _free(self, below: Any, *args: Any) -> Any:
        owner, zero, size = self.page_owner, self.zero_page, self.page_size
        return allocator_tap.release_slots(owner, zero, size, self.kv_allocator, below, *args, released=self._announce)

    def _alloc_rows(self, below: Any, reqs: list[Any]) -> Any:
        out = below(reqs)
        if out is not None and reqs:
            rows = [int(req.kv.req_pool_idx) for req in reqs]
            owners = [self.owner_of_req(req) for req in reqs]
            for row, req in zip(rows, reqs, strict=True):
                self._row_req[row] = weakref.ref(req)
            if self._verified is not None:
                self._verified.forget(rows)
            if self.row_owner.device.type == "cpu":
                self.row_owner.numpy()[rows] = owners  # (a view: no tensor built per call)
            else:
                index = torch.tensor(rows, dtype=torch.int64)
                self.row_owner[index] = torch.tensor(owners, dtype=torch.int32).to(self.row_owner.device)
            if self.state is not None:
                self.state.adopt(rows)
        return out

    def _free_rows(self, below: Any, indices: Any) -> None:
        rows = [int(i) for i in indices]
        for row in rows:
            self._row_req.pop(row, None)
        if self._verified is not None:
            self._verified.forget(rows)
        if rows:
            if self.row_owner.device.type == "cpu":
                self.row_owner.numpy()[rows] = FREE
            else:
                self.row_owner[torch.tensor(rows, dtype=torch.int64)] = FREE
            if self.state is not None:
                self.state.release(rows)
        below(indices)

    def add_draft_pool(self, tensors: PoolTensors) -> None:
        """A draft model's KV pool indexes the same slots: its zero page is zeroed too and checked by the
        test plant (reads of refused slots land there in draft passes)."""
        self.draft_buffers.extend(tensors.slots)
        self.draft_page_buffers.extend(tensors.pages)
        self._zero(self.zero_page)

    # ------------------------------------------------------------------ slots
    def slot_of(self, namespace: str | None) -> int:
        if namespace is None:
            return UNTAGGED
        slot = self._slots.get(namespace)
        if slot is None:
            slot = self._slots[namespace] = len(self._slots) + 1
            self._namespaces[slot] = namespace
        return slot

    def owner_of_req(self, req: Any) -> int:
        ns = self.cache.namespace_of_request(req.extra_key, req.cache_salt)
        slot = self.slot_of(ns)
        if slot not in self._allowed_rows:
            self._fill_allowed(slot, ns)
        return slot

    def _fill_allowed(self, slot: int, ns: str | None) -> None:
        """Write ``allowed[slot]``: the zero page's slot and the shared prefixes ``ns`` may read (fixed by
        configuration, so once per slot). Grows the table when needed (rare; scheduler thread)."""
        shared = [self.slot_of(Namespace.shared_prefix(n).key) for n in self.cache.readable_shared(ns)] if ns else []
        row = [self.zero_owner, *shared]
        rows, width = self.allowed.shape
        if slot >= rows or len(row) > width:
            grown = torch.full((max(rows, 2 * (slot + 1)), max(width, len(row))), FREE, dtype=torch.int32)
            grown = grown.to(self.allowed.device)
            grown[:rows, :width] = self.allowed
            grown[rows:, 0] = self.zero_owner
            self._retired.append(self.allowed)
            self.allowed = grown
        values = torch.full((self.allowed.shape[1],), FREE, dtype=torch.int32)
        values[: len(row)] = torch.tensor(row, dtype=torch.int32)
        self.allowed[slot] = values.to(self.allowed.device)
        self._allowed_rows.add(slot)

    def mark_owned(self, indices: list[int], namespace: str) -> None:
        """Pages the cache filled without a forward (host load-back) belong to ``namespace``'s slot."""
        pages = torch.tensor(sorted({i // self.page_size for i in indices}), dtype=torch.int64)
        self._changed(pages)
        self.page_owner[pages.to(self.page_owner.device)] = self.slot_of(namespace)

    def mark_shared(self, indices: list[int], name: str) -> None:
        """Pages holding the KV of declared shared prefix ``name`` belong to its slot."""
        pages = torch.tensor(sorted({i // self.page_size for i in indices}), dtype=torch.int64)
        self._changed(pages)
        self.page_owner[pages] = self.slot_of(Namespace.shared_prefix(name).key)

    # ------------------------------------------------------------------ the check
    def check_batch(self, forward_batch: Any) -> None:
        """Adopt this step's new pages and redirect every foreign or free slot of the batch's rows to the
        zero page: one pass over the batch's tokens, on the current (forward) stream, no host sync."""
        rows = forward_batch.req_pool_indices
        if self._host_route:
            if self._clean_on_host(forward_batch, rows):
                return
        elif rows.numel() == 0:
            return
        state_refused = None
        if self.state is not None:
            if rows.device.type == "cpu":
                for row in self.state.check(rows):
                    self._count_violation(row, 1, "recurrent-state slot")
            else:
                state_refused = self.state.check_queued(rows)  # read back with the KV counts (no sync here)
        seq_lens = forward_batch.seq_lens
        # NOTE: on the host the sum is free; on a device, SGLang's host-side seq_lens_sum avoids a sync.
        total = int(seq_lens.numpy().sum()) if seq_lens.device.type == "cpu" else forward_batch.seq_lens_sum
        if total is None:
            seq_lens_cpu = forward_batch.seq_lens_cpu
            total = int(seq_lens_cpu.sum()) if seq_lens_cpu is not None else int(seq_lens.sum())  # (sync; rare)
        write_start = _write_start(forward_batch, seq_lens)
        if forward_batch.forward_mode.is_target_verify():
            # NOTE: the drafts sit in each row right after the committed tokens and are written by this
            # forward: check [0, seq_len + drafts), adopting only the drafts' window.
            drafts = int(forward_batch.spec_info.draft_token_num)
            write_start, seq_lens = seq_lens, seq_lens + drafts
            total = int(total) + drafts * int(rows.numel())
        self.check_window(rows, seq_lens, write_start, int(total), state_refused=state_refused)
        if self.swa is not None:
            self._check_swa(self.swa, rows, seq_lens, write_start)

    def _clean_on_host(self, forward_batch: Any, rows: torch.Tensor) -> bool:
        """The CPU route of a plain KV pool: a batch whose every slot is its row owner's or one it may read (a
        declared shared prefix, the zero page) is decided from host lists alone (adopting this step's pages);
        anything else (False) takes the full pass below, which adopts the same pages again as a no-op and counts
        what it refuses. Speculative verify passes always take it. An empty batch has nothing to check (True)."""
        row_list = rows.tolist()
        if not row_list:
            return True
        mode = forward_batch.forward_mode
        ends = forward_batch.seq_lens.tolist()
        req_to_token = self.cache.req_to_token_pool.req_to_token
        views = self._host_views
        if views is None or views.table is not req_to_token:
            views = self._host_views = _HostViews.of(req_to_token, self)  # (a replaced row table: never in SGLang)
        # NOTE: decode first: it is nearly every step, and its check runs when the forward has left caches cold.
        if mode.is_decode():
            if views.route is not None and views.route.decide(row_list, ends):
                return True
            starts = [max(end - 1, 0) for end in ends]
        elif mode.is_target_verify():
            return False  # (the full pass forgets what was verified of these rows: check_window)
        elif mode.is_extend():
            starts = forward_batch.extend_prefix_lens_cpu
            if starts is None or len(starts) != len(ends):
                return False
        else:
            return False
        clean = clean_rows_host(
            req_to_token, row_list, list(starts), ends, self.page_owner, self.row_owner, self.allowed,
            page_size=self.page_size,
        )  # fmt: skip
        if clean and self._verified is not None:
            self._verified.record(views.req_to_token, row_list, ends, views.row_owner)
        return clean  # (when not clean, the full pass forgets these rows: check_window)

    def _check_swa(self, swa: SwaOwners, rows: torch.Tensor, ends: torch.Tensor, write_start: torch.Tensor) -> None:
        """The sliding-window sub-pool's check (:mod:`~sglang_iso.integration.swa_owner`), after the rows'."""
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        row_list = [int(r) for r in rows.tolist()]
        floors = []
        for row in row_list:
            ref = self._row_req.get(row)
            kv = getattr(ref() if ref is not None else None, "kv", None)
            # NOTE: without its request the cursor is unknown: 0 checks more columns, never fewer (fail closed)
            floors.append(int(kv.get_evicted_seqlen(ComponentType.SWA)) if kv is not None else 0)
        owners = [int(o) for o in self.row_owner[rows.to(torch.int64)].tolist()]
        req_to_token = self.cache.req_to_token_pool.req_to_token
        refused = swa.check(req_to_token, row_list, owners, ends.tolist(), write_start.tolist(), floors)
        for row, count in refused:
            self._count_violation(row, count, "sliding-window KV slots")

    def check_window(
        self,
        rows: torch.Tensor,
        ends: torch.Tensor,
        write_start: torch.Tensor,
        total: int,
        *,
        draft_step: bool = False,
        state_refused: torch.Tensor | None = None,
    ) -> None:
        """Sanitize ``req_to_token[rows[b], 0:ends[b]]`` (adopting columns from ``write_start[b]`` on), for
        checks that run before a forward's attention planning (``integration/spec_draft.py``). ``total`` is
        ``sum(ends)`` on the host; ``draft_step`` counts a speculative step checked before its draft passes;
        ``state_refused`` (``[B]`` int32 on the device) are the batch's refused state slots, read back with the KV
        counts."""
        if rows.numel() == 0:
            return
        if self._verified is not None:
            self._verified.forget(rows.tolist())  # the full pass may rewrite them
        if draft_step:
            self.draft_step_checks += 1
        counts = sanitize_rows(
            self.cache.req_to_token_pool.req_to_token,
            rows,
            ends,
            write_start,
            self.page_owner,
            self.row_owner,
            self.allowed,
            page_size=self.page_size,
            zero_page=self.zero_page,
            total_tokens=int(total),
        )
        if counts.device.type == "cpu":
            # NOTE: on CPU reading the counts back is free; only a refusal needs the bookkeeping.
            if bool(counts.numpy().any()):
                self._pending.append(_Pending(torch.stack([rows.to(torch.int32), counts]), None))
                self.drain()
            return
        parts = [rows.to(torch.int32), counts]
        if state_refused is not None:
            parts.append(state_refused.to(torch.int32))
        packed = torch.stack(parts)  # [2 or 3, B]
        host = torch.empty(packed.shape, dtype=torch.int32, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        done = torch.get_device_module(packed.device).Event()
        done.record()
        self._pending.append(_Pending(host, done))
        if len(self._pending) > _MAX_PENDING:
            self.drain(limit=len(self._pending) - _MAX_PENDING)

    def drain(self, limit: int | None = None) -> None:
        """Read back finished checks (waiting for them): count and log violations, mark rows to abort."""
        n = len(self._pending) if limit is None else limit
        for _ in range(n):
            counts, done = self._pending.popleft()
            if done is not None:
                done.synchronize()
            if counts.shape[0] > 2 and self.state is not None and bool((counts[2] > 0).any()):
                for row, refused in counts[::2, counts[2] > 0].t().tolist():
                    self.state.violations += refused
                    self._count_violation(row, refused, "recurrent-state slot")
            bad = counts[1] > 0
            if not bool(bad.any()):
                continue
            for row, refused in counts[:2, bad].t().tolist():
                self._count_violation(row, refused, "KV slots")

    def _count_violation(self, row: int, refused: int, what: str) -> None:
        """Count ``refused`` foreign or free ``what`` in ``row`` and mark its request to abort."""
        self.violations += refused
        owner = self._owner_name(int(self.row_owner[row]))
        self.violations_by_owner[owner] = self.violations_by_owner.get(owner, 0) + refused
        self.violating_rows.add(row)
        logger.error(
            "sglang-iso isolation-violation: %d foreign or free %s in row %d (owner slot %d); replaced by the zero "
            "page or slot, aborting the request",
            refused,
            what,
            row,
            int(self.row_owner[row]),
        )

    def abort_violators(self, batch: Any) -> None:
        """Scheduler thread, before a batch's results are processed: abort requests that hit a violation.

        NOTE: draining waits only for the checks already queued; the batch being processed finished its
        forward, so at most the next batch's check (not its forward) is waited for.
        """
        if self._pending:
            self.drain()
        if not self.violating_rows:
            return
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        aborted = 0
        for req in getattr(batch, "reqs", None) or []:
            row = req.kv.req_pool_idx
            if row is not None and int(row) in self.violating_rows:
                aborted += 1
                req.to_finish = FINISH_ABORT(
                    "sglang-iso: isolation violation: the request referenced KV it does not own; aborted",
                    err_type="IsolationViolation",
                )
                self.violating_rows.discard(int(row))
        if aborted:
            self._rezero()

    def _rezero(self) -> None:
        """Zero the zero page again: a refused slot in a column a speculative pass writes (its write
        locations are read from the sanitized row) lands there; likewise the zero state slot, which a refused row's
        forward updated in place."""
        self._zero(self.zero_page)
        if self.state is not None:
            self.state.rezero()
        if self.swa is not None:
            self.swa.zero()

    def status(self) -> dict[str, int]:
        """Counters for /get_server_info."""
        out = {"owner_violations": self.violations, "owner_draft_step_checks": self.draft_step_checks}
        if self.state is not None:
            out["owner_state_violations"] = self.state.violations
        if self.swa is not None:
            out["owner_swa_violations"] = self.swa.violations
        if self._verified is not None:
            # NOTE: times a released or re-marked page lay in a remembered column: each sends the next decode
            # step of every row to the full read (a finished request's own pages never count here).
            out["owner_memory_resets"] = self._verified.settled_forgetting
            out["owner_steps_from_memory"] = self._verified.decided
        return out

    def namespace_of(self, slot: int) -> str | None:
        """The namespace holding owner ``slot`` (None for UNTAGGED or an unknown slot)."""
        return self._namespaces.get(slot)

    def _owner_name(self, slot: int) -> str:
        """The tenant (or group) owning the namespace of owner ``slot``, as metrics label it."""
        ns = self.namespace_of(slot)
        namespace = self.cache.namespace_of(ns) if ns is not None else None
        return namespace.owner if namespace is not None else "open"


def _write_start(forward_batch: Any, seq_lens: torch.Tensor) -> torch.Tensor:
    """First column each request writes in this forward: its extend prefix, or the last token in decode."""
    if forward_batch.forward_mode.is_extend():
        prefix = getattr(forward_batch, "extend_prefix_lens", None)
        if prefix is not None:
            return prefix
        cpu = forward_batch.extend_prefix_lens_cpu or [0] * seq_lens.numel()
        return torch.tensor(cpu, dtype=torch.int32).to(seq_lens.device, non_blocking=True)
    if seq_lens.device.type == "cpu":
        return torch.from_numpy(np.maximum(seq_lens.numpy() - 1, 0))  # NOTE: numpy: a tenth of torch's cost
    return (seq_lens - 1).clamp_(min=0)
