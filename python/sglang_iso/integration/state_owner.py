"""State-slot ownership at forward time: a request of a hybrid linear-attention model reads and writes only its own
recurrent-state slot.

The KV owner check (:mod:`~sglang_iso.integration.owner_check`) covers the attention layers' KV; the linear-attention
layers read each request's state from ``req_index_to_mamba_index_mapping[row]`` (SGLang's ``get_mamba_indices``,
taken when the forward plans its metadata) and update it in place. A stale or planted slot there would run a request
on another request's state, or on a tree node's snapshot (another conversation), and write into it. Table, in the
scheduler process on the pool's device::

    slot_row[slot]   int32  the row whose request holds the state slot; FREE (-1) otherwise (free, or a tree
                            node's snapshot: the tree hands a snapshot to a request by copying it into the
                            request's own slot, never by pointing a row at it)

Maintained on the row pool's ``alloc`` (each row adopts the slot SGLang gave its request) and ``free_rows`` (the
row lets go of it), the same subscriptions as the KV row owners. Before every forward, with the KV check: a row
whose slot it does not hold is pointed at the zero slot (one slot of the state pool reserved at start, zeroed,
re-zeroed after a refused request's forward wrote into it), counted, logged, and the request aborted through the
KV check's abort path. Scheduler thread only.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

FREE = -1


class StateOwners:
    """Which row holds each recurrent-state slot of one hybrid row pool."""

    def __init__(self, req_to_token_pool: Any) -> None:
        """Raises:
        RuntimeError: no state slot left to reserve as the zero slot.
        """
        self.pool = req_to_token_pool
        self.mapping: torch.Tensor = req_to_token_pool.req_index_to_mamba_index_mapping
        slots = int(req_to_token_pool.mamba_pool.size) + 1
        self.slot_row = torch.full((slots,), FREE, dtype=torch.int32, device=self.mapping.device)
        reserved = req_to_token_pool.mamba_allocator.alloc(1)
        if reserved is None:
            raise RuntimeError("sglang-iso: could not reserve the zero state slot for the owner check")
        self.zero_slot = int(reserved[0])
        self.rezero()
        self.violations = 0

    def rezero(self) -> None:
        """Zero the zero slot in every state tensor (SGLang's own ``clear_slots``)."""
        index = torch.tensor([self.zero_slot], dtype=torch.int64, device=self.mapping.device)
        self.pool.mamba_pool.clear_slots(self.pool.translate_mamba_indices(index))

    def adopt(self, rows: list[int]) -> None:
        """After the row pool's ``alloc``: each row holds the slot SGLang assigned it."""
        index = torch.tensor(rows, dtype=torch.int64, device=self.mapping.device)
        self.slot_row[self.mapping[index].to(torch.int64)] = index.to(torch.int32)

    def release(self, rows: list[int]) -> None:
        """Before the row pool's ``free_rows``: the rows let go of every slot they hold (a finished request's slot
        may live on as a tree node's snapshot: no row holds it then). By value, not through the row's mapping,
        which a refused row no longer points at its own slot."""
        index = torch.tensor(rows, dtype=torch.int32, device=self.mapping.device)
        self.slot_row[torch.isin(self.slot_row, index)] = FREE

    def reserve_again(self, below: Any) -> None:
        """AROUND the slot allocator's ``clear`` (it frees every slot, the zero slot too): take a fresh one."""
        below()
        self.slot_row.fill_(FREE)
        reserved = self.pool.mamba_allocator.alloc(1)
        if reserved is None:
            raise RuntimeError("sglang-iso: could not reserve the zero state slot after a clear")
        self.zero_slot = int(reserved[0])
        self.rezero()

    def check(self, rows: torch.Tensor) -> list[int]:
        """Point every row of the batch whose slot it does not hold at the zero slot; returns those rows.

        NOTE: reads one bool back per forward: the host path (free on CPU); a device uses :meth:`check_queued`."""
        index, _, bad = self._held(rows)
        if not bool(bad.any()):
            return []
        refused = index[bad]
        self.mapping[refused] = self.zero_slot
        self.violations += int(refused.numel())
        out = [int(r) for r in refused.tolist()]
        logger.error(
            "sglang-iso isolation-violation: rows %s point at recurrent-state slots they do not hold; replaced by "
            "the zero state slot, aborting the requests",
            out,
        )
        return out

    def check_queued(self, rows: torch.Tensor) -> torch.Tensor:
        """:meth:`check` without reading anything back (a device): every row of the batch whose slot it does not
        hold is pointed at the zero slot; returns ``[B]`` int32, 1 for each such row, for the caller to read back
        with its other per-forward counts (and to count them in :attr:`violations` then)."""
        index, slots, bad = self._held(rows)
        self.mapping[index] = torch.where(bad, torch.full_like(slots, self.zero_slot), slots).to(self.mapping.dtype)
        return bad.to(torch.int32)

    def _held(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each row's index, the state slot it points at, and whether it does not hold that slot."""
        index = rows.to(torch.int64)
        slots = self.mapping[index].to(torch.int64)
        return index, slots, self.slot_row[slots] != index.to(torch.int32)

    @property
    def reserved(self) -> int:
        """State slots taken from the pool for good (SGLang's idle accounting counts them as protected)."""
        return 1
