"""OwnerTable on CPU without a server: the batched check, its read-back, aborts, and table growth.

The cache is a small stand-in with the attributes the table reads (allocator, row table, namespaces); the
check itself is the real ``sanitize_rows`` and the abort the real SGLang ``FINISH_ABORT``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_iso.integration.owner_check import FREE, OwnerTable

PAGES, ROWS, WIDTH = 32, 6, 16


class _Alloc:
    page_size = 1
    size = PAGES
    free_group = None

    def __init__(self) -> None:
        self.next = 1
        self.kv = SimpleNamespace(k_buffer=[torch.ones(PAGES + 2, 2, 4)], v_buffer=[torch.ones(PAGES + 2, 2, 4)])

    def alloc(self, n: int) -> torch.Tensor:
        out = torch.arange(self.next, self.next + n)
        self.next += n
        return out

    def get_kvcache(self) -> SimpleNamespace:
        return self.kv


def _table(shared_reader: str = "ns-a") -> tuple[OwnerTable, SimpleNamespace]:
    cache = SimpleNamespace(
        token_to_kv_pool_allocator=_Alloc(),
        device=torch.device("cpu"),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(ROWS, WIDTH, dtype=torch.int32)),
        readable_shared=lambda ns: ["prompt"] if ns == shared_reader else [],
        namespace_of=lambda ns: SimpleNamespace(owner={"ns-a": "acme", "ns-b": "globex"}.get(ns, ns)),
    )
    return OwnerTable(cache), cache


def _batch(rows: list[int], seq_lens: list[int], starts: list[int], drafts: int = 0) -> SimpleNamespace:
    """An extend batch, or with ``drafts`` an NGRAM verify batch (committed ``seq_lens``, drafts after)."""
    return SimpleNamespace(
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens),
        extend_prefix_lens=None if drafts else torch.tensor(starts),
        extend_prefix_lens_cpu=None if drafts else starts,
        forward_mode=ForwardMode.TARGET_VERIFY if drafts else ForwardMode.EXTEND,
        spec_info=SimpleNamespace(draft_token_num=drafts) if drafts else None,
    )


def _two_owners(table: OwnerTable) -> tuple[int, int]:
    """Owner slots of namespaces ``ns-a`` and ``ns-b``, their allowed rows filled."""
    a, b = table.slot_of("ns-a"), table.slot_of("ns-b")
    for slot, ns in ((a, "ns-a"), (b, "ns-b")):
        table._fill_allowed(slot, ns)
    return a, b


def _two_rows_prefilled() -> tuple[OwnerTable, SimpleNamespace, int, int]:
    """A table whose row 1 (owner ``ns-a``) holds slots 10-12 and row 2 (``ns-b``) slots 20-21, prefilled clean;
    the table, its cache and the two owner slots."""
    table, cache = _table()
    a, b = _two_owners(table)
    rtt = cache.req_to_token_pool.req_to_token
    table.row_owner[1], table.row_owner[2] = a, b
    rtt[1, :3] = torch.tensor([10, 11, 12])
    rtt[2, :2] = torch.tensor([20, 21])
    table.check_batch(_batch([1, 2], [3, 2], [0, 0]))
    return table, cache, a, b


def _decode(rows: list[int], seq_lens: list[int]) -> SimpleNamespace:
    """A decode batch (each row writes its last column)."""
    return SimpleNamespace(
        req_pool_indices=torch.tensor(rows),
        seq_lens=torch.tensor(seq_lens),
        seq_lens_sum=sum(seq_lens),
        forward_mode=ForwardMode.DECODE,
    )


def _req(row: int) -> SimpleNamespace:
    return SimpleNamespace(kv=SimpleNamespace(req_pool_idx=row), to_finish=None)


def test_foreign_slot_is_redirected_counted_and_its_request_aborted() -> None:
    table, cache = _table()
    a, b = _two_owners(table)
    rtt = cache.req_to_token_pool.req_to_token
    table.row_owner[1], table.row_owner[2] = a, b
    rtt[1, :4] = torch.tensor([10, 11, 12, 13])  # a writes pages 10-13 (FREE: adopted)
    rtt[2, :3] = torch.tensor([20, 21, 22])
    table.check_batch(_batch([1, 2], [4, 3], [0, 0]))
    assert table.violations == 0 and table.page_owner[10:14].tolist() == [a] * 4  # positive control
    rtt[2, 3] = 11  # b's row now points at a's page (old position: not adopted)
    table.check_batch(_batch([1, 2], [4, 4], [4, 4]))
    assert table.violations == 1 and table.violating_rows == {2}
    assert table.violations_by_owner == {"globex": 1}  # the owner of the row that held the slot (metrics label)
    assert int(rtt[2, 3]) == table.zero_page * table.page_size  # reads the zero page now
    assert int(rtt[1, 1]) == 11  # a's own row untouched
    reqs = [_req(1), _req(2)]
    table.abort_violators(SimpleNamespace(reqs=reqs))
    assert reqs[0].to_finish is None
    assert "isolation violation" in str(reqs[1].to_finish.message)
    assert table.violating_rows == set()


def test_shared_prefix_pages_readable_only_by_declared_readers() -> None:
    table, cache = _table(shared_reader="ns-a")
    a, b = _two_owners(table)
    table.mark_shared([5, 6], "prompt")
    rtt = cache.req_to_token_pool.req_to_token
    table.row_owner[1], table.row_owner[2] = a, b
    rtt[1, :3] = torch.tensor([5, 6, 14])
    rtt[2, :3] = torch.tensor([5, 6, 15])
    table.check_batch(_batch([1, 2], [3, 3], [2, 2]))
    assert table.violating_rows == {2} and table.violations == 2  # b may not read the shared pages
    assert rtt[1, :3].tolist() == [5, 6, 14]


def test_allowed_table_grows_past_its_initial_slots() -> None:
    table, _ = _table(shared_reader="ns-1030")
    rows_before = table.allowed.shape[0]
    for i in range(rows_before + 10):
        table._fill_allowed(table.slot_of(f"ns-{i}"), f"ns-{i}")
    slot = table.slot_of("ns-1030")
    assert table.allowed.shape[0] > slot and table._retired
    assert table.allowed[slot].tolist()[:2] == [table.zero_owner, table.slot_of("shared:prompt")]
    assert table.allowed[table.slot_of("ns-3")].tolist()[1:] == [FREE] * (table.allowed.shape[1] - 1)


def test_verify_pass_adopts_only_the_drafts_window() -> None:
    table, cache = _table()
    a, b = _two_owners(table)
    rtt = cache.req_to_token_pool.req_to_token
    table.row_owner[1], table.row_owner[2] = a, b
    rtt[1, :3] = torch.tensor([10, 11, 12])
    rtt[2, :3] = torch.tensor([20, 21, 22])
    table.check_batch(_batch([1, 2], [3, 3], [0, 0]))  # prefill: both adopt their pages
    rtt[1, 3:6] = torch.tensor([13, 14, 15])  # a's 3 drafts (FREE pages: adopted)
    rtt[2, 3:6] = torch.tensor([23, 24, 12])  # b's third draft slot is a's page
    table.check_batch(_batch([1, 2], [3, 3], [], drafts=3))
    assert table.page_owner[13:16].tolist() == [a] * 3 and table.page_owner[23:25].tolist() == [b] * 2
    assert table.violating_rows == {2} and table.violations == 1
    assert int(rtt[2, 5]) == table.zero_page * table.page_size and int(rtt[1, 2]) == 12
    # next round: a accepted two drafts (now committed, own); a stale FREE slot below seq_len is refused
    rtt[1, 1] = 30
    table.check_batch(_batch([1], [5], [], drafts=3))
    assert table.violating_rows == {1, 2} and int(table.page_owner[30]) == FREE


def _poisoned_dsa_pool() -> object:
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    pool = DSATokenToKVPool(
        size=256, page_size=64, kv_lora_rank=64, dtype=torch.bfloat16, qk_rope_head_dim=16, layer_num=2,
        device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=80, index_buf_size=256,
    )  # fmt: skip
    for buf in [*pool.kv_buffer, *pool.index_key_cache.buffer]:
        buf.view(torch.uint8).fill_(0x5A)
    return pool


def test_the_zero_page_is_zero_in_dsa_index_keys_of_target_and_draft() -> None:
    """Reads of refused slots land on the zero page: its index-key row is zero too, in the target's pool and a
    draft's, and again after a pass wrote into it; every other page keeps what it holds (control)."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    from sglang_iso.integration.scrub import pool_tensors

    target, draft = _poisoned_dsa_pool(), _poisoned_dsa_pool()
    allocator = PagedTokenToKVPoolAllocator(256, 64, torch.bfloat16, "cpu", target, need_sort=False)
    cache = SimpleNamespace(
        token_to_kv_pool_allocator=allocator,
        device=torch.device("cpu"),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(ROWS, 256, dtype=torch.int32)),
        readable_shared=lambda ns: [],
        namespace_of=lambda ns: SimpleNamespace(owner=ns),
    )
    table = OwnerTable(cache)
    zero, other = table.zero_page, table.zero_page % 4 + 1
    slots = slice(zero * 64, zero * 64 + 64)

    def zero_everywhere(pool: object) -> bool:
        tensors = pool_tensors(pool)
        return all(int(torch.count_nonzero(b.view(torch.uint8)[slots])) == 0 for b in tensors.slots) and all(
            int(torch.count_nonzero(b[zero])) == 0 for b in tensors.pages
        )

    assert zero_everywhere(target)
    assert all(bool(torch.all(b[other] == 0x5A)) for b in pool_tensors(target).pages)  # control
    assert not zero_everywhere(draft)
    table.add_draft_pool(pool_tensors(draft))
    assert zero_everywhere(draft) and table.draft_page_buffers
    for pool in (target, draft):
        pool.index_key_cache.buffer[0][zero] = 7  # a speculative pass wrote through a refused slot
    table._rezero()
    assert zero_everywhere(target) and zero_everywhere(draft)
    assert all(bool(torch.all(b[other] == 0x5A)) for b in pool_tensors(draft).pages)  # control


def test_clean_cpu_batches_are_decided_on_the_host_and_the_rest_by_the_full_pass(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The CPU route's rule: a batch whose slots are all its rows' own (or readable: a declared shared prefix) is
    decided from host lists, adopting its new pages; a planted slot hands the batch to ``sanitize_rows``, which
    redirects and counts it."""
    from sglang_iso.integration import owner_check

    full_passes = []
    real = owner_check.sanitize_rows
    monkeypatch.setattr(owner_check, "sanitize_rows", lambda *a, **k: full_passes.append(1) or real(*a, **k))
    table, cache = _table(shared_reader="ns-a")
    a, b = _two_owners(table)
    table.mark_shared([5], "prompt")
    rtt = cache.req_to_token_pool.req_to_token
    table.row_owner[1], table.row_owner[2], table.row_owner[3] = a, b, a
    rtt[1, :3] = torch.tensor([5, 10, 11])  # a reads the shared page, then its own new pages
    rtt[2, :2] = torch.tensor([20, 21])
    rtt[3, :2] = torch.tensor([24, 25])
    table.check_batch(_batch([1, 2, 3], [3, 2, 2], [1, 0, 0]))  # a prefill of three rows
    assert full_passes == [] and table.violations == 0
    assert table.page_owner[[10, 11, 20, 21, 24, 25]].tolist() == [a, a, b, b, a, a]
    decode = _decode([1, 2, 3], [4, 3, 3])
    rtt[1, 3], rtt[2, 2], rtt[3, 2] = 12, 22, 26  # each row's decode slot
    table.check_batch(decode)
    assert full_passes == [] and table.page_owner[[12, 22, 26]].tolist() == [a, b, a]
    rtt[2, 0] = 10  # b's row now points at a's page: the full pass takes it
    table.check_batch(_batch([1, 2], [4, 3], [4, 3]))
    assert full_passes == [1] and table.violations == 1 and table.violating_rows == {2}
    assert int(rtt[2, 0]) == table.zero_page * table.page_size and rtt[1, :4].tolist() == [5, 10, 11, 12]


def _passes_seen(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The owner check's reads, in order, as they run: ``clean_rows_host`` (host lists) and ``sanitize_rows`` (the
    full pass); a decode step decided from memory adds neither."""
    from sglang_iso.integration import owner_check

    calls: list[str] = []
    for name in ("sanitize_rows", "clean_rows_host"):
        real = getattr(owner_check, name)
        monkeypatch.setattr(owner_check, name, lambda *a, _n=name, _r=real, **k: calls.append(_n) or _r(*a, **k))
    return calls


def test_decode_steps_read_their_new_columns_and_still_see_a_plant_or_a_released_page(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """After a clean prefill, decode steps are decided from what was verified (neither the host lists route nor
    the full pass reads the windows again); an old column rewritten since, and a page released under a running
    row and adopted by another tenant, are still refused at the next step (the release forgets what was verified)."""
    calls = _passes_seen(monkeypatch)
    table, cache, a, b = _two_rows_prefilled()
    rtt = cache.req_to_token_pool.req_to_token
    assert calls == ["clean_rows_host"] and table.violations == 0

    def decode(ends: list[int]) -> SimpleNamespace:
        return _decode([1, 2], ends)

    calls.clear()
    rtt[1, 3], rtt[2, 2] = 13, 22
    table.check_batch(decode([4, 3]))
    assert calls == [] and table.page_owner[[13, 22]].tolist() == [a, b]  # positive control: new columns only
    rtt[1, 4], rtt[2, 3] = 14, 23
    rtt[2, 0] = 11  # b's old column rewritten to a's page since it was verified
    table.check_batch(decode([5, 4]))
    assert calls == ["clean_rows_host", "sanitize_rows"] and table.violations == 1 and table.violating_rows == {2}
    assert int(rtt[2, 0]) == table.zero_page * table.page_size and table.page_owner[[14, 23]].tolist() == [a, b]
    table.violating_rows.clear()
    calls.clear()
    rtt[1, 5], rtt[2, 4] = 15, 24
    table.check_batch(decode([6, 5]))  # everything verified again: back to the new columns
    assert calls == ["clean_rows_host"]
    calls.clear()
    rtt[1, 6], rtt[2, 5] = 16, 25
    table.check_batch(decode([7, 6]))
    assert calls == [] and table.violations == 1
    # Slot 12 (a's, in a's running row) is released, and b's next step takes it.
    table._free(lambda *_: None, torch.tensor([12]))
    assert int(table.page_owner[12]) == FREE
    rtt[1, 7], rtt[2, 6] = 17, 12
    table.check_batch(decode([8, 7]))
    assert "sanitize_rows" in calls and table.violations == 2 and table.violating_rows == {1}
    assert int(rtt[1, 2]) == table.zero_page * table.page_size and int(table.page_owner[12]) == b


def test_a_finished_request_gives_its_pages_back_and_the_other_rows_stay_decided_from_memory(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """SGLang's release order: a finished request's slots are freed, then its row; the running row's next step is
    still decided from its new column. Control in the same run: a page of the running row released under it is read
    in full at its next step and refused there (a FREE page in an old column)."""
    calls = _passes_seen(monkeypatch)
    table, cache, a, _ = _two_rows_prefilled()
    rtt = cache.req_to_token_pool.req_to_token
    rtt[1, 3], rtt[2, 2] = 13, 22
    table.check_batch(_decode([1, 2], [4, 3]))
    calls.clear()
    table._free(lambda *_: None, torch.tensor([20, 21, 22]))  # row 2's request finished: its slots, then its row
    table._free_rows(lambda _: None, [2])
    assert table.page_owner[[20, 21, 22]].tolist() == [FREE] * 3
    rtt[1, 4] = 14
    table.check_batch(_decode([1], [5]))
    assert calls == [] and int(table.page_owner[14]) == a  # decided from memory: nothing read in full
    table._free(lambda *_: None, torch.tensor([11]))  # a slot of the running row 1 released under it
    rtt[1, 5] = 15
    table.check_batch(_decode([1], [6]))
    assert calls == ["clean_rows_host", "sanitize_rows"] and table.violating_rows == {1}
    assert int(rtt[1, 1]) == table.zero_page * table.page_size


def test_a_replaced_row_table_is_read_not_the_views_of_the_old_one() -> None:
    """The host route keeps numpy views of the row table; should the pool's table object ever be replaced, a
    decode step reads the new one: a clean step on it passes, and a plant in it is refused."""
    table, cache, _, b = _two_rows_prefilled()
    rtt = cache.req_to_token_pool.req_to_token
    rtt[2, 2] = 22
    table.check_batch(_decode([2], [3]))
    assert table.violations == 0 and int(table.page_owner[22]) == b
    fresh = rtt.clone()
    fresh[2, 3] = 23
    cache.req_to_token_pool.req_to_token = fresh
    table.check_batch(_decode([2], [4]))
    assert table.violations == 0 and int(table.page_owner[23]) == b  # positive control: the new table, clean
    fresh[2, 4] = 24
    fresh[2, 0] = 11  # b's row in the new table now points at a's page
    table.check_batch(_decode([2], [5]))
    assert table.violations == 1 and table.violating_rows == {2}
    assert int(fresh[2, 0]) == table.zero_page * table.page_size and int(rtt[2, 0]) == 20
