"""The torch stand-ins for SGLang's speculative-decoding ops against SGLang's own Triton kernels.

The Triton kernels run in the interpreter on CPU (``TRITON_INTERPRET=1``, set by this folder's conftest);
each scenario is random per seed, and both implementations get identical copies of the inputs.
"""

from __future__ import annotations

import pytest
import torch

from sglang_iso.platform import spec_cpu
from test.kernels.conftest import SEEDS, TRITON_RUNNABLE

pytestmark = pytest.mark.skipif(not TRITON_RUNNABLE, reason="Triton cannot run here")

ROWS, POOL_LEN = 8, 64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _req_to_token(gen: torch.Generator) -> torch.Tensor:
    return torch.randint(1, 4096, (ROWS, POOL_LEN), generator=gen, dtype=torch.int32)


def _batch(gen: torch.Generator, bs: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = torch.randperm(ROWS, generator=gen)[:bs].to(torch.int64)
    start = torch.randint(0, POOL_LEN - max_len, (bs,), generator=gen, dtype=torch.int64)
    end = start + torch.randint(0, max_len + 1, (bs,), generator=gen, dtype=torch.int64)
    return rows, start, end


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_req_to_token_pool(seed: int) -> None:
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    gen = _gen(seed)
    table = _req_to_token(gen)
    rows, start, end = _batch(gen, 4, 20)
    out = torch.randint(1, 4096, (int((end - start).sum()),), generator=gen, dtype=torch.int64)
    ours, theirs = table.clone(), table.clone()
    spec_cpu.assign_req_to_token_pool_cpu(rows, ours, start, end, out, POOL_LEN)
    assign_req_to_token_pool[(4,)](rows, theirs, start, end, out, POOL_LEN, 4)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, table) or int((end - start).sum()) == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_extend_cache_locs(seed: int) -> None:
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs

    gen = _gen(seed)
    table = _req_to_token(gen)
    rows, start, end = _batch(gen, 4, 20)
    total = int((end - start).sum())
    ours = torch.full((total,), -1, dtype=torch.int64)
    theirs = ours.clone()
    spec_cpu.assign_extend_cache_locs_cpu(rows, table, start, end, ours, POOL_LEN)
    assign_extend_cache_locs[(4,)](rows, table, start, end, theirs, POOL_LEN, 4)
    assert torch.equal(ours, theirs)
    assert total == 0 or int(ours.min()) >= 1


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_draft_cache_locs_contiguous(seed: int) -> None:
    from sglang.kernels.ops.speculative.cache_locs import assign_draft_cache_locs_contiguous

    gen = _gen(seed)
    table = _req_to_token(gen)
    bs, topk, steps = 3, 2, 3
    rows = torch.randperm(ROWS, generator=gen)[:bs].to(torch.int64)
    seq_lens = torch.randint(0, POOL_LEN - topk * steps, (bs,), generator=gen, dtype=torch.int64)
    ours = torch.full((bs * topk * steps,), -1, dtype=torch.int64)
    theirs = ours.clone()
    spec_cpu.assign_draft_cache_locs_contiguous_cpu(rows, table, seq_lens, ours, POOL_LEN, topk, steps)
    assign_draft_cache_locs_contiguous[(bs,)](rows, table, seq_lens, theirs, POOL_LEN, topk, steps, BS=bs)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_bonus_and_accept_out_cache_loc(seed: int) -> None:
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc, fill_bonus_tokens

    gen = _gen(seed)
    bs, width = 4, 5
    tokens = torch.randint(0, 2048, (bs, width), generator=gen, dtype=torch.int32)
    lens = torch.randint(1, width + 1, (bs,), generator=gen, dtype=torch.int32)
    ours, theirs = torch.zeros(bs, dtype=torch.int32), torch.zeros(bs, dtype=torch.int32)
    spec_cpu.fill_bonus_tokens_cpu(tokens, lens, ours, width)
    fill_bonus_tokens[(bs,)](tokens, lens, theirs, width)
    assert torch.equal(ours, theirs)

    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    for b in range(bs):
        accept_index[b, : int(lens[b])] = torch.arange(int(lens[b]), dtype=torch.int32) + b * width
    out_cache_loc = torch.randint(1, 4096, (bs * width,), generator=gen, dtype=torch.int64)
    ours_loc = torch.full((bs * width,), -1, dtype=torch.int64)
    theirs_loc = ours_loc.clone()
    spec_cpu.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, ours_loc)
    size = bs * width
    fill_accept_out_cache_loc[(size,)](accept_index, out_cache_loc, theirs_loc, 32)
    assert torch.equal(ours_loc, theirs_loc)


def _random_tree_mask(gen: torch.Generator, bs: int, n: int) -> torch.Tensor:
    """Ancestor masks of random trees in BFS-ish order: node i's parent is some j < i; node 0 is the root."""
    mask = torch.zeros(bs, n, n, dtype=torch.bool)
    for b in range(bs):
        mask[b, 0, 0] = True
        for i in range(1, n):
            parent = int(torch.randint(0, i, (1,), generator=gen))
            mask[b, i] = mask[b, parent]
            mask[b, i, i] = True
    return mask.reshape(-1)


def _tree_outputs(bs: int, n: int) -> list[torch.Tensor]:
    return [
        torch.full((bs * n,), -9, dtype=torch.int64),
        torch.full((bs, n), -9, dtype=torch.int64),
        torch.full((bs, n), -9, dtype=torch.int64),
        torch.full((bs, n), -9, dtype=torch.int64),
    ]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 5, 8])
def test_reconstruct_indices_from_tree_mask(seed: int, n: int) -> None:
    from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_triton

    gen = _gen(seed)
    bs = 3
    mask = _random_tree_mask(gen, bs, n)
    seq_lens = torch.randint(1, 100, (bs,), generator=gen, dtype=torch.int64)
    ours, theirs = _tree_outputs(bs, n), _tree_outputs(bs, n)
    spec_cpu.reconstruct_indices_from_tree_mask(mask, seq_lens, *ours, bs, n)
    reconstruct_indices_from_tree_mask_triton(mask, seq_lens, *theirs, bs, n)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_verify_tree_greedy(seed: int) -> None:
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    gen = _gen(seed)
    bs, n, steps = 3, 8, 5
    positions, retrieve_index, next_token, next_sibling = _tree_outputs(bs, n)
    spec_cpu.reconstruct_indices_from_tree_mask(
        _random_tree_mask(gen, bs, n), torch.zeros(bs, dtype=torch.int64), positions, retrieve_index,
        next_token, next_sibling, bs, n,
    )  # fmt: skip
    candidates = torch.randint(0, 3, (bs, n), generator=gen, dtype=torch.int64)  # small vocab: many matches
    target = torch.randint(0, 3, (bs, n), generator=gen, dtype=torch.int64)
    results = []
    for fn in (spec_cpu.verify_tree_greedy_cpu, verify_tree_greedy_triton):
        predicts = torch.zeros(bs * n, dtype=torch.int32)
        accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
        accept_num = torch.zeros(bs, dtype=torch.int32)
        fn(predicts, accept_index, accept_num, candidates, retrieve_index, next_token, next_sibling, target)
        results.append((predicts, accept_index, accept_num))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_copy_all_layer_kv_cache(seed: int) -> None:
    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_tiled

    gen = _gen(seed)
    slots, layers = 32, 3
    base = [torch.randn(slots, 2, 4, generator=gen) for _ in range(layers)]
    perm = torch.randperm(slots, generator=gen)
    src, tgt = perm[:6].to(torch.int64), perm[6:12].to(torch.int64)
    results = []
    for use_triton in (False, True):
        bufs = [b.clone() for b in base]
        ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
        strides = torch.tensor([b[0].nbytes for b in bufs], dtype=torch.int64)
        if use_triton:
            grid = (layers, 1)
            copy_all_layer_kv_cache_tiled[grid](ptrs, strides, tgt, src, 6, 8, BYTES_PER_TILE=64)
        else:
            spec_cpu.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
        results.append(bufs)
    for ours, theirs, orig in zip(*results, base, strict=True):
        assert torch.equal(ours, theirs)
        assert torch.equal(ours[tgt], orig[src])


def _eagle_tree_inputs(gen: torch.Generator, bs: int, topk: int, depth: int, n: int) -> tuple[torch.Tensor, ...]:
    """Random but well-formed EAGLE selections: step 0's top-k, then per step top-k children of a chosen
    parent; ``selected_index`` picks ``n - 1`` of the ``topk + (depth - 1) * topk * topk`` candidates."""
    cands = topk + (depth - 1) * topk * topk
    parent_list = torch.zeros(bs, topk * (depth - 1) + 1, dtype=torch.int64)
    selected = torch.zeros(bs, n - 1, dtype=torch.int64)
    for b in range(bs):
        parent_list[b, 1:] = torch.sort(torch.randperm(cands, generator=gen)[: topk * (depth - 1)]).values
        selected[b] = torch.sort(torch.randperm(cands, generator=gen)[: n - 1]).values
    seq_lens = torch.randint(1, 12, (bs,), generator=gen, dtype=torch.int64)
    return parent_list, selected, seq_lens


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", [0, 1])
def test_build_tree_kernel_efficient(seed: int, mode: int) -> None:
    from sglang.kernels.ops.speculative.spec_tree import sgl_build_tree_kernel_triton

    gen = _gen(seed)
    bs, topk, depth, n = 2, 2, 3, 6
    parent_list, selected, seq_lens = _eagle_tree_inputs(gen, bs, topk, depth, n)
    mask_len = (int(seq_lens.sum()) * n + n * n * bs) if mode == 0 else n * n * bs
    results = []
    for fn in (spec_cpu.build_tree_kernel_efficient_cpu, sgl_build_tree_kernel_triton):
        mask = torch.ones(mask_len, dtype=torch.bool)
        positions = torch.full((bs * n,), -9, dtype=torch.int64)
        retrieve = [torch.full((bs, n), -1, dtype=torch.int64) for _ in range(3)]
        fn(parent_list, selected, seq_lens, mask, positions, *retrieve, topk, depth, n, mode)
        results.append((mask, positions, *retrieve))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b), (a, b)
    assert int(results[0][3].max()) > 0  # the tree has links (the comparison is not of two empty trees)
