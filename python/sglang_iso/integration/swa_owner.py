"""Sliding-window page ownership at forward time, for SGLang's SWA sub-pool layout.

In that layout a hybrid SWA model keeps its sliding-window layers' KV in a sub-pool of its own: a request's row in
``req_to_token`` holds full-pool slots, and the sliding layers read ``full_to_swa_index_mapping[slot]``. The KV owner
check (:mod:`~sglang_iso.integration.owner_check`) sanitizes the rows, that is the full side; a stale or planted
mapping entry would still send a sliding layer to another request's window. Table, in the scheduler process on the
pool's device::

    page_owner[swa_page]   int32  owner slot of each page of the sliding-window sub-pool; FREE (-1) after release

Kept on the sub-pool's own allocator: its release (every SWA free path ends there: a request's or the tree's
``free``, SGLang's out-of-window frees of running requests, grouped frees) marks pages FREE. Before every forward,
after the rows are sanitized, for each request the columns its sliding layers can read, from
``max(its SWA eviction cursor, first written column - window)`` to its end: the pages this step writes are adopted
(FREE or already its own); every other column must map to a page of the request's owner or to the zero page. A
column that does not (another owner's page, a FREE page, an unmapped entry) has its mapping entry pointed at the
zero page of the sub-pool (reserved at start, zeroed, never released; the full pool's zero page maps there too),
is counted, logged, and its request aborted through the KV check's abort path. The entry belongs to a full slot of
the request's own namespace, so the tree node holding it reads zeros from then on and frees only the zero page,
which this table never lets go. Scheduler thread only.

NOTE: the check reads each batch's windows on the host (SGLang's sub-pool layout with the owner check is served on
CPU here); a device build of it would queue its counts like the KV check does.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang_iso.integration import allocator_tap

logger = logging.getLogger(__name__)

FREE = allocator_tap.FREE_PAGE


def is_swa_sub_pool(allocator: Any) -> bool:
    """``allocator`` is SGLang's SWA hybrid allocator (a full and a sliding-window sub-allocator and the map
    between them), not a pool whose every slot is both."""
    full = getattr(allocator, "full_attn_allocator", None)
    swa = getattr(allocator, "swa_attn_allocator", None)
    return (
        full is not None
        and swa is not None
        and full is not swa
        and getattr(allocator, "full_to_swa_index_mapping", None) is not None
    )


class SwaOwners:
    """Which owner holds each page of one SWA sub-pool, and the check of a batch's sliding-window reads."""

    def __init__(self, allocator: Any, window: int, zero_owner: int) -> None:
        """Raises:
        RuntimeError: no page of the sub-pool left to reserve as its zero page.
        """
        self.allocator = allocator
        self.sub = allocator.swa_attn_allocator
        self.mapping: torch.Tensor = allocator.full_to_swa_index_mapping
        self.page_size = int(allocator.page_size)
        self.window = int(window)
        self.zero_owner = zero_owner
        num_pages = int(self.sub.size) // self.page_size + 2
        self.page_owner = torch.full((num_pages,), FREE, dtype=torch.int32, device=self.mapping.device)
        self.zero_page = self._reserve()
        self.full_zero_page = -1  # the full pool's zero page, mapped here (:meth:`map_zero`)
        self.violations = 0

    # ------------------------------------------------------------------ zero page
    def _reserve(self) -> int:
        slots = self.sub.alloc(self.page_size)
        if slots is None:
            raise RuntimeError("sglang-iso: could not reserve the sliding-window zero page for the owner check")
        page = int(slots[0]) // self.page_size
        self.page_owner[page] = self.zero_owner
        self.zero(page)
        return page

    def zero(self, page: int | None = None) -> None:
        """Zero ``page`` (the zero page by default) in every buffer of the sub-pool."""
        from sglang_iso.integration.scrub import pool_tensors, zero_pages

        page = self.zero_page if page is None else page
        index = torch.tensor([page], dtype=torch.int64, device=self.mapping.device)
        zero_pages(pool_tensors(self.sub.get_kvcache()), index, self.page_size)

    def map_zero(self, full_zero_page: int | None = None) -> None:
        """Point the full pool's zero page at this sub-pool's zero page (SGLang clears a mapping entry on every SWA
        free, the zero page's too, when a refused row is released)."""
        if full_zero_page is not None:
            self.full_zero_page = full_zero_page
        if self.full_zero_page < 0:
            return
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.mapping.device)
        self.mapping[self.full_zero_page * self.page_size + offsets] = self.zero_page * self.page_size + offsets

    def reset(self, full_zero_page: int) -> None:
        """After the allocator's ``clear`` (every page freed, the map zeroed): a fresh zero page, mapped."""
        self.page_owner.fill_(FREE)
        self.zero_page = self._reserve()
        self.map_zero(full_zero_page)

    # ------------------------------------------------------------------ tap layers
    def release_paged(self, below: Any, *page_ids: torch.Tensor) -> Any:
        """AROUND the sub-allocator's ``_release_page_ids``: the zero page stays reserved; released pages are FREE."""
        return allocator_tap.release_pages(self.page_owner, self.zero_page, below, *page_ids)

    def release_slots(self, below: Any, *args: Any) -> Any:
        """AROUND the sub-allocator's ``free`` (page size 1: slots are pages)."""
        return allocator_tap.release_slots(self.page_owner, self.zero_page, self.page_size, self.sub, below, *args)

    def restore_map(self, below: Any, *args: Any, **kwargs: Any) -> Any:
        """AROUND the allocator's ``clear_full_to_swa_mapping``: the zero page keeps its entries."""
        out = below(*args, **kwargs)
        self.map_zero()
        return out

    # ------------------------------------------------------------------ the check
    def check(
        self,
        req_to_token: torch.Tensor,
        rows: list[int],
        owners: list[int],
        ends: list[int],
        write_starts: list[int],
        floors: list[int],
    ) -> list[tuple[int, int]]:
        """Adopt this step's sliding-window pages and redirect every other column a request's sliding layers can
        read that is not its owner's; returns ``(row, refused columns)`` for each row with a refusal.

        ``floors[b]`` is the request's SWA eviction cursor (columns below it were freed out of the window)."""
        self.map_zero()
        refused_rows: list[tuple[int, int]] = []
        limit = self.page_owner.numel()
        for row, me, end, start, floor in zip(rows, owners, ends, write_starts, floors, strict=True):
            lo = max(floor, start - self.window, 0)
            if me < 0 or lo >= end:
                continue
            full = req_to_token[row, lo:end].to(torch.int64)
            swa = self.mapping[full.clamp(min=0)]
            page = torch.div(swa, self.page_size, rounding_mode="floor")
            mapped = (full >= 0) & (swa > 0) & (page < limit)
            page_c = torch.where(mapped, page, torch.zeros_like(page))
            new = torch.arange(lo, end, device=full.device) >= start
            current = self.page_owner[page_c]
            adopt = mapped & new & ((current == FREE) | (current == me))
            self.page_owner[page_c[adopt]] = me
            owner = self.page_owner[page_c]
            ok = mapped & ((owner == me) | (owner == self.zero_owner))
            if bool(ok.all()):
                continue
            bad = full[~ok & (full >= 0)]
            offsets = torch.remainder(bad, self.page_size)
            self.mapping[bad] = self.zero_page * self.page_size + offsets
            refused = int((~ok).sum())
            self.violations += refused
            refused_rows.append((row, refused))
        return refused_rows

    @property
    def reserved(self) -> int:
        """Sliding-window tokens taken from the sub-pool for good."""
        return self.page_size
