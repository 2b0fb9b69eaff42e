"""Scrub-on-free for recurrent state: a freed Mamba / linear-attention state slot is zeroed before its next owner.

Hybrid linear-attention models (Qwen3.5 and Qwen3-Next GDN, Nemotron-H and Falcon-H1 Mamba2) keep, per request, a
recurrent state slot in SGLang's ``MambaPool`` (per layer: convolution windows and the temporal state, plus the
slot's registered side states). The state is the request's prompt in another form. SGLang zeroes a slot at its
next owner's first use (``mamba_needs_clear``), not when it is freed, and draft workers skip even that. Every free
path ends in ``MambaSlotAllocator.free`` (request release, tree eviction of a snapshot, admission rollback, unused
pre-allocated slots), so that is where this subscribes, through the row pool's allocator
:mod:`~sglang_iso.integration.allocator_tap`:

    MambaSlotAllocator.free                   -> slot ids recorded as pending
    MambaSlotAllocator.alloc / alloc_group_begin
                                              -> every pending slot zeroed first (SGLang's own ``clear_slots``:
                                                 convolution, temporal and registered side states)
    MambaSlotAllocator.clear                  -> every slot zeroed (a cleared allocator frees slots in use too)

so every slot on the free list is zero or pending, and none is handed out pending. A state layout whose tensors
``clear_slots`` does not zero (ReplaySSM rings, speculative intermediates, an int8 checkpoint pool, a side state
that is not registered on the pool) is refused at construction, naming the tensor.

Installed by the tenant cache factory for hybrid linear-attention models, beside the KV scrubber (their tree is
:class:`~sglang_iso.integration.hybrid_cache.TenantHybridCache`). Scheduler thread only.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang_iso.coverage import NotCoveredError
from sglang_iso.integration import allocator_tap
from sglang_iso.integration.allocator_tap import Order

logger = logging.getLogger(__name__)

_STATE_FIELDS = frozenset({"conv", "temporal"})
"""The fields of a ``MambaPool.State`` that ``clear_slots`` zeroes; any other field must be None."""
_POOL_INDEX_ATTRS = frozenset(
    {"mamba_allocator", "req_to_token", "req_index_to_mamba_index_mapping",
     "req_index_to_mamba_ping_pong_track_buffer_mapping"}
)  # fmt: skip
"""Row pool attributes holding slot and row numbers only."""
_POOL_METADATA_ATTRS = frozenset({"mamba_cache", "_conv_slot_desc", "_conv_fuse_ok"})
"""``MambaPool`` attributes that are not tenant state beside the state itself: the fused kernels' cached
addresses and strides of the convolution tensors."""
_SIDE_STATES = {"ShortConvPool": frozenset({"conv_state"}), "NGramPool": frozenset({"context"})}
"""Side-state class -> the tensors its ``reset_slots`` resets (``clear_slots`` calls it for registered ones)."""
_ROW_POOL_STATE_ATTRS = ("mamba_ckpt_pool", "ple_window_cache")
"""Row pool attributes holding tenant state outside the ``MambaPool``: covered only when absent."""


def uncovered_state_tensors(req_to_token_pool: Any) -> frozenset[str]:
    """``Class.attribute`` of every recurrent-state tensor a hybrid row pool holds that :class:`MambaScrubber` would
    not zero (empty: every one is covered)."""
    pool = getattr(req_to_token_pool, "mamba_pool", None)
    if pool is None or getattr(req_to_token_pool, "mamba_allocator", None) is None:
        return frozenset({f"{type(req_to_token_pool).__name__}.mamba_pool"})
    out: set[str] = set()
    state = getattr(pool, "mamba_cache", None)
    fields = getattr(state, "__dataclass_fields__", None)
    if not fields or not set(fields) >= _STATE_FIELDS:
        out.add(f"{type(pool).__name__}.mamba_cache")
    else:
        out |= {
            f"{type(pool).__name__}.mamba_cache.{name}"
            for name in fields
            if name not in _STATE_FIELDS and getattr(state, name) is not None
        }
    out |= {
        f"{type(pool).__name__}.{attr}"
        for attr, value in vars(pool).items()
        if attr not in _POOL_METADATA_ATTRS and _holds_tensor(value)
    }
    siblings = list(getattr(pool, "_slot_siblings", ()))
    for sibling in siblings:
        reset = _SIDE_STATES.get(type(sibling).__name__)
        out |= {
            f"{type(sibling).__name__}.{attr}"
            for attr, value in vars(sibling).items()
            if _holds_tensor(value) and (reset is None or attr not in reset)
        }
    for attr, value in vars(req_to_token_pool).items():
        if attr == "mamba_pool" or attr in _POOL_INDEX_ATTRS or any(value is s for s in siblings):
            continue
        if attr in _ROW_POOL_STATE_ATTRS and value is not None:
            out.add(f"{type(req_to_token_pool).__name__}.{attr}")
        elif type(value).__module__.startswith("sglang.") and _holds_tensor_inside(value):
            out.add(f"{type(req_to_token_pool).__name__}.{attr}")  # a side state not registered on the pool
    return frozenset(out)


class MambaScrubber:
    """Zeroes freed recurrent-state slots of one hybrid row pool. Single-threaded (scheduler thread)."""

    def __init__(self, req_to_token_pool: Any, forward_stream: Any = None) -> None:
        """Raises:
        NotCoveredError: the pool holds state tensors ``clear_slots`` does not zero (named).
        """
        missing = uncovered_state_tensors(req_to_token_pool)
        if missing:
            raise NotCoveredError(f"recurrent-state tensors scrub-on-free does not zero: {', '.join(sorted(missing))}")
        self.pool = req_to_token_pool.mamba_pool
        self.allocator = req_to_token_pool.mamba_allocator
        self.forward_stream = forward_stream
        self.pending: list[torch.Tensor] = []  # slot ids freed but not yet zeroed
        self.scrubbed_slots = 0
        self.scrub_calls = 0

    def install(self) -> MambaScrubber:
        """Subscribe to the slot allocator's release and hand-outs (innermost layer)."""
        tap = allocator_tap.tap_of(self.allocator)
        tap.subscribe("free", Order.SCRUB, self._free)
        for name in ("alloc", "alloc_group_begin"):
            tap.subscribe(name, Order.SCRUB, self._flush_before)
        tap.subscribe("clear", Order.SCRUB, self._clear)
        logger.info("sglang-iso: scrub-on-free installed on %s.free", type(self.allocator).__name__)
        return self

    def flush(self) -> int:
        """Zero every pending slot now; returns the number of slots zeroed."""
        if not self.pending:
            return 0
        slots = torch.unique(torch.cat(self.pending).to(torch.int64))
        self.pending = []
        if slots.is_cuda and self.forward_stream is not None:
            # NOTE: a forward still reading these states must finish before they are zeroed.
            torch.cuda.current_stream().wait_stream(self.forward_stream)
        self.pool.clear_slots(slots)
        self.scrubbed_slots += int(slots.numel())
        self.scrub_calls += 1
        return int(slots.numel())

    def status(self) -> dict[str, int]:
        return {
            "state_scrubbed_slots": self.scrubbed_slots,
            "state_scrub_calls": self.scrub_calls,
            "state_pending_slots": sum(int(p.numel()) for p in self.pending),
        }

    def _free(self, below: Any, free_index: torch.Tensor) -> None:
        if free_index.numel():
            self.pending.append(free_index.detach().reshape(-1).clone())
        below(free_index)

    def _flush_before(self, below: Any, *args: Any, **kwargs: Any) -> Any:
        self.flush()
        return below(*args, **kwargs)

    def _clear(self, below: Any) -> None:
        self.pending = [torch.arange(int(self.allocator.size) + 1, device=self.allocator.device)]
        self.flush()
        below()


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() > 0
    if isinstance(value, list | tuple):
        return any(_holds_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    return False


def _holds_tensor_inside(value: Any) -> bool:
    return hasattr(value, "__dict__") and any(_holds_tensor(v) for v in vars(value).values())
