"""A draft model's KV pool under the scrubber and the owner check, on real SGLang pools (CPU).

The draft runner shares the target's allocator and row table and keeps its own KV buffers at the same slot
indices. Poison and check: pages freed on each path are zero in the draft pool too before they are handed
out again; without attaching the draft pool its residue survives (so the tests can fail). The decode-step
entry check sanitizes the draft window before any draft pass could plan attention from it.
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_iso import envvars, settings
from sglang_iso.coverage import NotCoveredError
from sglang_iso.identity.tags import NamespaceResolver
from sglang_iso.integration import hook_table, runtime, spec_draft
from sglang_iso.integration.owner_check import OwnerTable
from sglang_iso.integration.scrub import KvScrubber
from sglang_iso.integration.tenant_cache import TenantRadixCache

SIZE, PAGE, LAYERS, POISON = 64, 4, 2, 7.0


def _pool(cls: type[MHATokenToKVPool] = MHATokenToKVPool) -> MHATokenToKVPool:
    return cls(
        size=SIZE, page_size=PAGE, dtype=torch.float32, head_num=2, head_dim=4, layer_num=LAYERS, device="cpu",
        enable_memory_saver=False,
    )  # fmt: skip


def make(
    *, owners: bool = False, eagle: bool = False
) -> tuple[TenantRadixCache, PagedTokenToKVPoolAllocator, MHATokenToKVPool, object]:
    target, draft = _pool(), _pool()
    allocator = PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.float32, "cpu", target, need_sort=False)
    rows = ReqToTokenPool(size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(
        disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=allocator, page_size=PAGE, is_eagle=eagle
    )
    cache = TenantRadixCache(params, NamespaceResolver(None))
    cache.scrubber = KvScrubber(allocator, rows).install()
    if owners:
        cache.page_owners = OwnerTable(cache).install()
    runner = SimpleNamespace(req_to_token_pool=rows, token_to_kv_pool_allocator=allocator, token_to_kv_pool=draft)
    worker = SimpleNamespace(_draft_model_runners=lambda: (runner,), topk=1, adaptive_controller=None)
    return cache, allocator, draft, SimpleNamespace(tree_cache=cache, draft_worker=worker)


@pytest.fixture
def hook_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HookRegistry, "_patched", {*HookRegistry._patched, *hook_table.targets(group="spec-draft")})


def _poison(kv: MHATokenToKVPool, slots: torch.Tensor) -> None:
    for layer in range(LAYERS):
        kv.k_buffer[layer][slots] = POISON
        kv.v_buffer[layer][slots] = -POISON


def _rows(kv: MHATokenToKVPool, slots: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.cat([kv.k_buffer[i][slots], kv.v_buffer[i][slots]]) for i in range(LAYERS)])


def _alloc_all(allocator: PagedTokenToKVPoolAllocator) -> torch.Tensor:
    out = allocator.alloc(allocator.available_size())
    assert out is not None
    return out


def test_freed_draft_pages_are_zeroed_on_eviction_and_release(hook_applied: None) -> None:
    cache, allocator, draft, scheduler = make()
    assert spec_draft.attach_draft_pools(scheduler) == 2 * LAYERS
    target = allocator.get_kvcache()
    evicted, released, live = allocator.alloc(8), allocator.alloc(8), allocator.alloc(8)
    for slots in (evicted, released, live):
        _poison(target, slots)
        _poison(draft, slots)
    cache.insert(InsertParams(key=RadixKey(array("q", range(8)), extra_key="a"), value=evicted.to(torch.int64)))
    assert cache.evict(EvictParams(num_tokens=8)).num_tokens_evicted == 8  # tree eviction path
    allocator.free_segment(released, start_pos=0)  # request release path
    _alloc_all(allocator)
    for slots in (evicted, released):
        assert torch.count_nonzero(_rows(target, slots)) == 0
        assert torch.count_nonzero(_rows(draft, slots)) == 0  # the draft copy of the page too
    assert torch.all(_rows(draft, live).abs() == POISON)  # control: live pages untouched
    assert cache.scrubber.status()["draft_buffers"] == 2 * LAYERS


def test_without_the_draft_pool_its_residue_survives() -> None:
    # Negative control: the scrubber alone zeroes the target's buffers only.
    _, allocator, draft, _ = make()
    slots = allocator.alloc(8)
    _poison(allocator.get_kvcache(), slots)
    _poison(draft, slots)
    allocator.free(slots)
    _alloc_all(allocator)
    assert torch.count_nonzero(_rows(allocator.get_kvcache(), slots)) == 0
    assert torch.all(_rows(draft, slots).abs() == POISON)


def test_zero_page_is_zero_in_the_draft_pool(hook_applied: None) -> None:
    cache, _, draft, scheduler = make(owners=True)
    zero = torch.arange(cache.page_owners.zero_page * PAGE, (cache.page_owners.zero_page + 1) * PAGE)
    _poison(draft, zero)
    spec_draft.attach_draft_pools(scheduler)
    assert torch.count_nonzero(_rows(draft, zero)) == 0


@pytest.mark.parametrize(
    "problem",
    ["own_rows", "own_allocator", "hook_missing", "adaptive", "paged_topk", "pipeline", "dp_coordination",
     "pool_class", "pool_tensor"],
)  # fmt: skip
def test_uncovered_draft_configurations_are_refused(problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, _, scheduler = make()
    if problem != "hook_missing":
        monkeypatch.setattr(HookRegistry, "_patched", {*HookRegistry._patched, *hook_table.targets(group="spec-draft")})
    else:
        monkeypatch.setattr(HookRegistry, "_patched", set())
    runner = scheduler.draft_worker._draft_model_runners()[0]
    if problem == "own_rows":
        runner.req_to_token_pool = ReqToTokenPool(size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    elif problem == "own_allocator":
        runner.token_to_kv_pool_allocator = object()
    elif problem == "adaptive":
        scheduler.draft_worker.adaptive_controller = object()
    elif problem == "paged_topk":
        scheduler.draft_worker.topk = 2
    elif problem == "pipeline":
        scheduler.server_args = SimpleNamespace(pp_size=2)
    elif problem == "dp_coordination":
        scheduler.draft_worker.enable_dp_spec_prefill_coordination = True
    elif problem in ("pool_class", "pool_tensor"):
        runner.token_to_kv_pool = _pool(_PoolWithTail if problem == "pool_class" else MHATokenToKVPool)
        runner.token_to_kv_pool.tail = torch.zeros(SIZE + 1, 8)  # a tensor the scrubber does not know
    with pytest.raises(NotCoveredError, match="not covered") as err:
        spec_draft.attach_draft_pools(scheduler)
    if problem == "pool_class":
        assert "_PoolWithTail (not in the model-family table)" in str(err.value)
    elif problem == "pool_tensor":
        assert "MHATokenToKVPool.tail" in str(err.value)


class _PoolWithTail(MHATokenToKVPool):
    """A KV pool class SGLang might add: the draft check refuses it by name."""


def _decode_batch(rows: list[int], seq_lens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
    )


def test_decode_step_window_is_sanitized_before_the_draft_plans(
    hook_applied: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, allocator, _, scheduler = make(owners=True)
    spec_draft.attach_draft_pools(scheduler)
    table = cache.page_owners
    monkeypatch.setattr(runtime, "_active", runtime.SchedulerRuntime(settings.current(), cache, table, None))
    a, b = table.slot_of("ns-a"), table.slot_of("ns-b")
    for slot, ns in ((a, "ns-a"), (b, "ns-b")):
        table._fill_allowed(slot, ns)
    rtt = cache.req_to_token_pool.req_to_token
    table.row_owner[1], table.row_owner[2] = a, b
    committed_a, committed_b, window = allocator.alloc(8), allocator.alloc(8), allocator.alloc(8)
    table.page_owner[committed_a // PAGE] = a
    table.page_owner[committed_b // PAGE] = b
    rtt[1, :8] = committed_a.to(torch.int32)
    rtt[1, 8:12] = window[:4].to(torch.int32)  # this step's draft window: FREE pages, adopted
    worker = SimpleNamespace(speculative_num_steps=3, topk=1, speculative_num_draft_tokens=4)
    spec_draft.check_before_spec_step(worker, _decode_batch([1], [8]))
    assert table.violations == 0 and int(table.page_owner[int(window[0]) // PAGE]) == a  # positive control
    assert table.draft_step_checks == 1
    rtt[1, 9] = int(committed_b[0])  # a stale index into b's page inside the draft window
    rtt[1, 2] = int(committed_b[1])  # and one in the committed prefix
    spec_draft.check_before_spec_step(worker, _decode_batch([1], [8]))
    assert table.violations == 2 and table.violating_rows == {1}
    zero = table.zero_page * PAGE
    assert int(rtt[1, 9]) // PAGE == table.zero_page and int(rtt[1, 2]) // PAGE == table.zero_page
    assert zero <= int(rtt[1, 2]) < zero + PAGE
    extend = SimpleNamespace(**{**vars(_decode_batch([1], [8])), "forward_mode": ForwardMode.EXTEND})
    spec_draft.check_before_spec_step(worker, extend)  # prefill: the target's forward check runs first
    assert table.draft_step_checks == 2


def test_scheduler_refuses_uncovered_algorithms_before_any_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_iso.integration.hooks import refuse_uncovered_speculative

    monkeypatch.setenv(envvars.REQUIRE_TENANT_CACHE.name, "1")
    for name in ("DFLASH", "FROZEN_KV_MTP", "UNO", "DSPARK"):
        with pytest.raises(NotCoveredError, match=f"--speculative-algorithm {name} "):
            refuse_uncovered_speculative(None, SimpleNamespace(speculative_algorithm=name))
    for name in (None, "NGRAM", "STANDALONE", "EAGLE", "EAGLE3", "NEXTN"):  # positive control: covered ones start
        refuse_uncovered_speculative(None, SimpleNamespace(speculative_algorithm=name))
    monkeypatch.delenv(envvars.REQUIRE_TENANT_CACHE.name)  # an upstream server (benchmark baseline) is left alone
    settings.reset()
    refuse_uncovered_speculative(None, SimpleNamespace(speculative_algorithm="DFLASH", radix_cache_backend=None))


def _request(cache: TenantRadixCache, allocator: PagedTokenToKVPoolAllocator, tokens: list[int], row: int) -> object:
    """A request that computed ``tokens`` into fresh slots of row ``row`` (the scheduler's view before caching)."""
    slots = allocator.alloc(len(tokens) + (-len(tokens)) % PAGE)
    assert slots is not None
    cache.req_to_token_pool.req_to_token[row, : len(tokens)] = slots[: len(tokens)].to(torch.int32)
    kv = SimpleNamespace(req_pool_idx=row, cache_protected_len=0, cache_inserted_len=0)
    return SimpleNamespace(full_untruncated_fill_ids=tokens, extra_key="a", cache_salt=None, kv=kv, lock=None,
                           last_node=cache.root_node)  # fmt: skip


@pytest.mark.parametrize("eagle", [False, True])
def test_eagle_tree_caches_a_request_up_to_its_last_known_next_token(eagle: bool) -> None:
    # With an EAGLE-style draft head the draft KV at position i was made with token i + 1, so a request of
    # n tokens caches the pages of its first n - 1 positions; another request that agrees on n tokens but
    # goes on differently reuses them, never position n - 1 itself.
    cache, allocator, _, _ = make(eagle=eagle)
    tokens = [100 + i for i in range(3 * PAGE + 1)]  # 13 tokens: 12 pairs, 3 whole pages either way
    req = _request(cache, allocator, tokens, row=0)
    cache.checkpoint(req, up_to=len(tokens))
    assert req.kv.cache_protected_len == 3 * PAGE  # both modes: 3 whole pages held by the tree
    same = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), extra_key="a")))
    assert same.device_prefix_len == 3 * PAGE  # positive control: the same tokens hit
    cut = [*tokens[: 2 * PAGE + 1], 7]  # agrees on 2 pages + 1 token, then differs
    other = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", cut), extra_key="a")))
    assert other.device_prefix_len == 2 * PAGE
    edge = [*tokens[: 2 * PAGE], 7]  # agrees on exactly 2 pages: the last of them was drafted with 100 + 8 next
    hit = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", edge), extra_key="a"))).device_prefix_len
    assert hit == (PAGE if eagle else 2 * PAGE)
    foreign = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), extra_key="b")))
    assert foreign.device_prefix_len == 0
    cache.unlock(req.lock)
    assert cache.tree.check_integrity() is None
