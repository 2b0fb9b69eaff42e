"""Page ownership at attention time: a wrong index in a request's row reads zeros, never a neighbour's KV.

The tree decides what a request may reuse; this is the second line of defence
for when the code around it is wrong (a stale or planted index in
``req_to_token``). Tables, kept in the scheduler process:

    page_owner[page]  int32  owner slot of each KV page; FREE (-1) after release
    row_owner[row]    int32  owner slot of the request holding each req_to_token row
    owner slots       one small int per tree namespace (and per declared shared prefix)

Before every forward of the torch_native backend (``init_forward_metadata``),
for each request: the pages it writes in this step (its new tokens) are adopted
if FREE or already its own; every page in its row window must then be its own,
a shared prefix it may read, or the zero page. Anything else is replaced by the
dedicated zero page (reserved at start, zeroed, never written, never freed), the
violation is counted and logged, and the request is aborted with a clear error
before its result is processed. The check itself is ``checked_gather_slots``
from ``sgl-kernel-patches``.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from typing import Any

import torch

logger = logging.getLogger(__name__)

FREE = -1
UNTAGGED = 0  # requests without a verified namespace: they never share, so one slot for all is enough
OWNER_CHECK_ENV = "SGLANG_ISO_KV_OWNER_CHECK"  # "on" (default) or "off"
TEST_PLANT_ENV = "SGLANG_ISO_TEST_PLANT_FOREIGN"  # test-only: arms "sglang_iso.test_plant:<owner>" commands
CHECKED_BACKENDS = ("torch_native",)

ACTIVE: OwnerTable | None = None  # this scheduler process's table (set by the factory)


def check_before_forward(original: Any, backend: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``TorchNativeAttnBackend.init_forward_metadata``: run the owner check once per forward."""
    if ACTIVE is not None and getattr(forward_batch, "req_pool_indices", None) is not None:
        ACTIVE.check_batch(forward_batch)
    return original(backend, forward_batch, *args, **kwargs)


def abort_before_results(scheduler: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE ``Scheduler.process_batch_result``: requests that hit a violation finish as aborted."""
    if ACTIVE is not None and batch is not None:
        ACTIVE.abort_violators(batch)


class OwnerTable:
    """Owner slots of pages and rows for one KV pool. Scheduler thread only."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        allocator = cache.token_to_kv_pool_allocator
        self.page_size = int(allocator.page_size)
        device = cache.device
        num_pages = allocator.size // self.page_size + 2
        self.page_owner = torch.full((num_pages,), FREE, dtype=torch.int32, device=device)
        rows = cache.req_to_token_pool.req_to_token.shape[0]
        self.row_owner = torch.full((rows,), FREE, dtype=torch.int32, device=device)
        self._row_req: dict[int, weakref.ReferenceType[Any]] = {}
        self._slots: dict[str, int] = {}
        self._namespaces: dict[int, str] = {}  # slot -> namespace (reverse of _slots)
        self._allowed: dict[int, torch.Tensor] = {}  # owner slot -> int32 slots it may read besides its own
        self.violations = 0
        self.violating_rows: set[int] = set()
        self.armed_plants: set[str] = set()  # test-only (TEST_PLANT_ENV)
        self._planted: dict[int, list[tuple[int, int]]] = {}  # test-only: row -> (position, original slot)
        self.zero_owner = self.slot_of("sglang-iso/zero-page")
        self.zero_page = self._reserve_zero_page()

    def _reserve_zero_page(self) -> int:
        """Take one page from the allocator for good and zero it; reads of refused slots land here."""
        from sglang_iso.integration.scrub import kv_buffers
        from sglang_iso_kernels import scrub_pages

        allocator = self.cache.token_to_kv_pool_allocator
        slots = allocator.alloc(self.page_size)
        if slots is None:
            raise RuntimeError("sglang-iso: could not reserve the zero page for the owner check")
        page = int(slots[0]) // self.page_size
        scrub_pages(kv_buffers(allocator.get_kvcache()), torch.tensor([page], dtype=torch.int64), self.page_size)
        self.page_owner[page] = self.zero_owner
        return page

    # ------------------------------------------------------------------ wiring
    def install(self) -> OwnerTable:
        alloc = self.cache.token_to_kv_pool_allocator
        pool = self.cache.req_to_token_pool
        original_clear = alloc.clear

        @functools.wraps(original_clear)
        def clear() -> None:
            # A cleared pool frees every page, the zero page too: take a fresh one.
            original_clear()
            self.page_owner.fill_(FREE)
            self.zero_page = self._reserve_zero_page()

        alloc.clear = clear
        paged = hasattr(alloc, "_release_page_ids")
        name = "_release_page_ids" if paged else "free"
        original = getattr(alloc, name)

        @functools.wraps(original)
        def release(*args: Any) -> Any:
            # The zero page is never released: a row slot replaced by it must not free it.
            if paged:
                args = tuple(p[p != self.zero_page] for p in args)
                for pages in args:
                    self.page_owner[pages.to(torch.int64)] = FREE
            elif args and args[0].numel():
                slots = args[0]
                args = (slots[slots // self.page_size != self.zero_page], *args[1:])
                if alloc.free_group is None:
                    self.page_owner[args[0].to(torch.int64) // self.page_size] = FREE
            return original(*args)

        setattr(alloc, name, release)
        original_alloc = pool.alloc

        @functools.wraps(original_alloc)
        def alloc_rows_for(reqs: list[Any]) -> Any:
            out = original_alloc(reqs)
            if out is not None:
                for req in reqs:
                    row = int(req.kv.req_pool_idx)
                    self.row_owner[row] = self.owner_of_req(req)
                    self._row_req[row] = weakref.ref(req)
            return out

        pool.alloc = alloc_rows_for
        original_free_rows = pool.free_rows

        @functools.wraps(original_free_rows)
        def free_rows(indices: Any) -> None:
            for i in indices:
                self.row_owner[int(i)] = FREE
                self._row_req.pop(int(i), None)
            original_free_rows(indices)

        pool.free_rows = free_rows
        logger.info("sglang-iso: KV owner check installed (zero page %d)", self.zero_page)
        return self

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
        from sglang.srt.mem_cache.radix_cache import RadixKey

        ns = self.cache._namespace(RadixKey([], req.extra_key, cache_salt=req.cache_salt))
        return self.slot_of(ns)

    def allowed_for(self, owner: int, device: torch.device) -> torch.Tensor:
        """The zero page's slot and the shared-prefix slots ``owner`` may read (fixed by configuration)."""
        allowed = self._allowed.get(owner)
        if allowed is None:
            ns = self._namespaces.get(owner)
            shared = [self.slot_of("shared:" + name) for name in self.cache.readable_shared(ns)] if ns else []
            allowed = self._allowed[owner] = torch.tensor([self.zero_owner, *shared], dtype=torch.int32, device=device)
        return allowed

    def mark_shared(self, indices: list[int], name: str) -> None:
        """Pages holding the KV of declared shared prefix ``name`` belong to its slot."""
        pages = torch.tensor(sorted({i // self.page_size for i in indices}), dtype=torch.int64)
        self.page_owner[pages] = self.slot_of("shared:" + name)

    # ------------------------------------------------------------------ the check
    def check_batch(self, forward_batch: Any) -> None:
        """Adopt this step's new pages, then replace every foreign or free page of each row by the zero page."""
        from sglang_iso_kernels import checked_gather_slots

        req_to_token = self.cache.req_to_token_pool.req_to_token
        rows = forward_batch.req_pool_indices.tolist()
        seq_lens = forward_batch.seq_lens.tolist()
        if forward_batch.forward_mode.is_extend():
            prefix_lens = list(forward_batch.extend_prefix_lens_cpu or [0] * len(rows))
        else:
            prefix_lens = [max(n - 1, 0) for n in seq_lens]
        for row, seq_len, prefix_len in zip(rows, seq_lens, prefix_lens, strict=False):
            owner = int(self.row_owner[row])
            if owner == FREE:
                continue
            if self.armed_plants and self._plant(row, owner, req_to_token):
                pass
            slots = req_to_token[row, :seq_len].to(torch.int64)
            new_pages = slots[prefix_len:] // self.page_size
            current = self.page_owner[new_pages]
            adopt = (current == FREE) | (current == owner)
            self.page_owner[new_pages[adopt]] = owner
            checked = checked_gather_slots(
                slots,
                self.page_owner,
                owner,
                page_size=self.page_size,
                zero_page=self.zero_page,
                allowed_extra=self.allowed_for(owner, slots.device),
            )
            bad = int(checked.violations)
            if bad:
                req_to_token[row, :seq_len] = checked.slots.to(req_to_token.dtype)
                self.violations += bad
                self.violating_rows.add(row)
                logger.error(
                    "sglang-iso isolation-violation: %d foreign or free KV slots in row %d (owner slot %d); "
                    "replaced by the zero page, aborting the request",
                    bad,
                    row,
                    owner,
                )

    def abort_violators(self, batch: Any) -> None:
        """Scheduler thread, before a batch's results are processed: abort requests that hit a violation."""
        if not self.violating_rows:
            return
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        req_to_token = self.cache.req_to_token_pool.req_to_token
        for req in getattr(batch, "reqs", None) or []:
            row = req.kv.req_pool_idx
            if row is not None and int(row) in self.violating_rows:
                for pos, original in self._planted.pop(int(row), []):
                    req_to_token[int(row), pos] = original  # test plant: give the row its own slot back
                req.to_finish = FINISH_ABORT(
                    "sglang-iso: isolation violation: the request referenced KV it does not own; aborted",
                    err_type="IsolationViolation",
                )
                self.violating_rows.discard(int(row))

    def _plant(self, row: int, owner: int, req_to_token: torch.Tensor) -> bool:
        """Test-only: write one slot of a page another owner holds at position 0 of this row."""
        ns = self._namespaces.get(owner)
        tenant = self.cache.resolver.tenant_of(ns) if ns else None
        if tenant not in self.armed_plants:
            return False
        foreign = ((self.page_owner != owner) & (self.page_owner > self.zero_owner)).nonzero().flatten()
        if foreign.numel() == 0:
            return False
        self.armed_plants.discard(tenant)
        self._planted.setdefault(row, []).append((0, int(req_to_token[row, 0])))
        req_to_token[row, 0] = int(foreign[0]) * self.page_size
        logger.warning("sglang-iso: TEST plant of a foreign slot into row %d", row)
        return True


def owner_check_mode() -> str:
    mode = os.environ.get(OWNER_CHECK_ENV, "on")
    if mode not in ("on", "off"):
        raise ValueError(f"{OWNER_CHECK_ENV}={mode!r}: expected 'on' or 'off'")
    return mode
