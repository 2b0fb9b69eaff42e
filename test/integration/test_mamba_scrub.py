"""Scrub-on-free for recurrent state, on SGLang's own ``HybridReqToTokenPool`` and ``MambaPool`` (CPU).

Every state slot (convolution windows and temporal state of every Mamba layer) is poisoned; slots go back to the
slot allocator by SGLang's own request release (``free_mamba_cache``), a direct free (tree eviction of a snapshot,
admission rollback) and the unused rest of a pre-allocated group. Each must be zero before it is handed out again,
and a slot still held keeps its state. A pool with state ``clear_slots`` would not zero is refused, naming it.
"""

from __future__ import annotations

import collections
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

from sglang_iso import coverage
from sglang_iso.coverage import NotCoveredError
from sglang_iso.integration.mamba_scrub import MambaScrubber, uncovered_state_tensors

SLOTS = 8
POISON = 5.0


def _pool(**extra: Any) -> Any:
    shape = Mamba2StateShape.create(
        tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=4, head_dim=8, state_size=4, conv_kernel=4
    )
    return HybridReqToTokenPool(
        size=4, mamba_size=SLOTS, mamba_spec_state_size=SLOTS, max_context_len=64, device="cpu",
        enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=shape, layers=[0, 2]), mamba_layer_ids=[0, 2],
        enable_mamba_extra_buffer=False, enable_overlap_schedule=False, **extra,
    )  # fmt: skip


def _states(pool: Any) -> list[torch.Tensor]:
    cache = pool.mamba_pool.mamba_cache
    return [*cache.conv, cache.temporal]


def _poison(pool: Any, slots: list[int]) -> None:
    """Owners' state in ``slots`` (a free slot holds nothing of anyone: only owned slots are written)."""
    for state in _states(pool):
        state[:, slots] = POISON


def _zero(pool: Any, slots: list[int]) -> bool:
    return all(bool((state[:, slots] == 0).all()) for state in _states(pool))


def _poisoned(pool: Any, slots: list[int]) -> bool:
    return all(bool((state[:, slots] == POISON).all()) for state in _states(pool))


def _slot(pool: Any) -> int:
    got = pool.mamba_allocator.alloc(1)
    assert got is not None
    return int(got[0])


def test_every_free_path_zeroes_the_slot_before_its_next_owner_and_held_slots_keep_their_state() -> None:
    pool = _pool()
    assert uncovered_state_tensors(pool) == frozenset()
    scrubber = MambaScrubber(pool).install()
    released, direct, held = _slot(pool), _slot(pool), _slot(pool)
    _poison(pool, [released, direct, held])

    req = SimpleNamespace(kv=SimpleNamespace(mamba_pool_idx=torch.tensor(released)))
    pool.free_mamba_cache(req)  # SGLang's request release
    pool.mamba_allocator.free(torch.tensor([direct]))  # a snapshot evicted, an admission rolled back
    # Positive control: nothing is zeroed at free time; the next hand-out does it, in one batch.
    assert _poisoned(pool, [released, direct])
    pool.mamba_allocator.alloc_group_begin(3)  # slots reserved for a batch of matches (a hand-out) ...
    assert _zero(pool, [released, direct])
    used = _slot(pool)
    _poison(pool, [used])  # its new owner's state
    pool.mamba_allocator.alloc_group_end()  # ... the unused ones go back
    _slot(pool)
    assert _poisoned(pool, [held, used])  # still owned: untouched
    status = scrubber.status()
    assert status["state_scrubbed_slots"] >= 4 and status["state_pending_slots"] == 0, status


def test_every_free_slot_is_zero_after_a_churn_of_owners() -> None:
    pool = _pool()
    MambaScrubber(pool).install()
    rng = torch.Generator().manual_seed(0)
    owned: list[int] = []
    for step in range(60):
        if owned and (len(owned) == SLOTS - 1 or torch.rand(1, generator=rng).item() < 0.5):
            slot = owned.pop(int(torch.randint(len(owned), (1,), generator=rng)))
            pool.mamba_allocator.free(torch.tensor([slot]))
        else:
            slot = _slot(pool)
            for state in _states(pool):
                state[:, slot] = float(step + 1)  # the new owner's state
            owned.append(slot)
    _slot(pool)  # a hand-out: pending slots zeroed
    free = [int(s) for s in pool.mamba_allocator.free_slots]
    assert free and _zero(pool, free)


def test_clear_zeroes_every_slot() -> None:
    pool = _pool()
    MambaScrubber(pool).install()
    _poison(pool, [_slot(pool), _slot(pool)])
    pool.mamba_allocator.clear()  # every slot free at once, the held ones too
    assert _zero(pool, list(range(SLOTS + 1)))


def test_state_the_scrubber_would_miss_is_refused_by_name() -> None:
    pool = _pool()
    pool.mamba_pool.side_rows = torch.zeros(SLOTS + 1, 2)  # a tensor clear_slots does not know
    with pytest.raises(NotCoveredError, match=r"MambaPool\.side_rows"):
        MambaScrubber(pool)
    del pool.mamba_pool.side_rows
    pool.mamba_ckpt_pool = SimpleNamespace(states=torch.zeros(4))  # an int8 checkpoint pool of its own
    assert uncovered_state_tensors(pool) == frozenset({"HybridReqToTokenPool.mamba_ckpt_pool"})
    pool.mamba_ckpt_pool = None
    pool.mamba_pool.mamba_cache = pool.mamba_pool.SpeculativeState(
        conv=pool.mamba_pool.mamba_cache.conv, temporal=pool.mamba_pool.mamba_cache.temporal,
        intermediate_ssm=torch.zeros(2, SLOTS, 1), intermediate_conv_window=[torch.zeros(2, SLOTS, 1)],
    )  # fmt: skip
    assert uncovered_state_tensors(pool) == frozenset(
        {"MambaPool.mamba_cache.intermediate_ssm", "MambaPool.mamba_cache.intermediate_conv_window"}
    )


def test_hybrid_ssm_models_are_served_and_the_extra_buffer_strategy_is_refused() -> None:
    """The state slots are covered with the no-buffer strategy; the extra buffer's track slots are not."""
    features = coverage.Features(stage="scheduler", kv_pool_class="HybridLinearKVPool", hybrid_ssm=True,
                                 mamba_strategy="no_buffer")  # fmt: skip
    assert coverage.refusals(features) == []
    refused = coverage.refusals(replace(features, mamba_strategy="extra_buffer"))
    assert [r.feature for r in refused] == [
        "hybrid SSM/Mamba models with `--mamba-radix-cache-strategy` other than `no_buffer`"
    ]


def test_the_fused_kernels_address_table_is_not_state() -> None:
    """On CUDA SGLang caches the convolution tensors' addresses and strides on the pool (``_conv_slot_desc``): slot
    numbers and pointers, no tenant data, so the pool stays covered."""
    pool = _pool()
    pool.mamba_pool.__dict__["_conv_slot_desc"] = (torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64))
    assert uncovered_state_tensors(pool) == frozenset()


def _req() -> Any:
    kv = SimpleNamespace(req_pool_idx=None, holds_kv=False, kv_allocated_len=0, holds_mamba=False, mamba_pool_idx=None,
                         mamba_needs_clear=False, mamba_ping_pong_track_buffer=None)  # fmt: skip
    return SimpleNamespace(kv=kv)


def test_a_row_pointed_at_a_state_slot_it_does_not_hold_is_sent_to_the_zero_slot() -> None:
    """Rows adopt the slots SGLang gives their requests; a row pointed at another row's slot, or at a slot no row
    holds (a tree snapshot), is redirected to the zero slot and reported; rows on their own slots are left alone."""
    from sglang_iso.integration.state_owner import StateOwners

    pool = _pool()
    owners = StateOwners(pool)
    zero = owners.zero_slot
    assert _zero(pool, [zero])
    reqs = [_req(), _req(), _req()]
    rows = pool.alloc(reqs)
    owners.adopt(rows)
    mapping = pool.req_index_to_mamba_index_mapping
    own = [int(mapping[r]) for r in rows]
    batch = torch.tensor(rows)
    assert owners.check(batch) == []  # control: every row on its own slot
    snapshot = _slot(pool)  # a slot no row holds, as a tree node's snapshot
    mapping[rows[0]] = own[1]  # another request's state
    mapping[rows[2]] = snapshot
    assert owners.check(batch) == [rows[0], rows[2]]
    assert [int(mapping[r]) for r in rows] == [zero, own[1], zero]
    assert owners.violations == 2
    owners.release(rows[:1])  # the refused row lets go of its own slot too (not through its mapping)
    assert int(owners.slot_row[own[0]]) == -1 and int(owners.slot_row[own[1]]) == rows[1]
    _poison(pool, [zero])  # a refused forward updates the zero slot in place ...
    owners.rezero()  # ... and the abort zeroes it again
    assert _zero(pool, [zero])


def test_the_queued_state_check_redirects_the_same_rows_without_reading_back() -> None:
    """The device path (:meth:`StateOwners.check_queued`, run here on CPU) redirects exactly the rows the host path
    does and returns them as per-row counts, which the owner table reads back with its KV counts (the third row of
    a pending result) and counts as state violations; rows on their own slots stay (control)."""
    from sglang_iso.integration.owner_check import OwnerTable, _Pending
    from sglang_iso.integration.state_owner import StateOwners

    pool = _pool()
    owners = StateOwners(pool)
    rows = pool.alloc([_req(), _req(), _req()])
    owners.adopt(rows)
    mapping = pool.req_index_to_mamba_index_mapping
    own = [int(mapping[r]) for r in rows]
    batch = torch.tensor(rows)
    assert owners.check_queued(batch).tolist() == [0, 0, 0]  # control
    mapping[rows[1]] = own[2]
    refused = owners.check_queued(batch)
    assert refused.tolist() == [0, 1, 0] and owners.violations == 0  # nothing counted before the read-back
    assert [int(mapping[r]) for r in rows] == [own[0], owners.zero_slot, own[2]]

    table = OwnerTable.__new__(OwnerTable)  # only what drain reads: the pending queue and the counters
    table.state, table.violations, table.violations_by_owner, table.violating_rows = owners, 0, {}, set()
    table.row_owner = torch.full((8,), -1, dtype=torch.int32)
    table._namespaces, table.cache = {}, SimpleNamespace(namespace_of=lambda ns: None)
    table._pending = collections.deque(
        [_Pending(torch.stack([batch.to(torch.int32), torch.zeros(3, dtype=torch.int32), refused]), None)]
    )
    table.drain()
    assert owners.violations == 1 and table.violating_rows == {rows[1]} and table.violations == 1
