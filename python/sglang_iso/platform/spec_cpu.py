"""Torch stand-ins for the speculative-decoding kernels SGLang calls on CPU.

SGLang's CPU path calls ``sgl_kernel`` ops for speculative decoding (NGRAM,
EAGLE-style and standalone draft workers), and no CPU build of ``sgl_kernel`` is
published. These are straightforward torch implementations of the same
contracts (the argument lists are SGLang's CPU call sites; the semantics are
those of SGLang's own Triton kernels, which the kernel tests compare against
under ``TRITON_INTERPRET=1``). They are slow loops over the batch, which is fine
for the small batches a CPU server runs.

:func:`install` replaces the raising stand-ins of :mod:`sglang_iso.platform.cpu`
with these and adds the ``sgl_kernel.speculative`` submodule. The EAGLE-style
ones (draft cache locations, tree builder) make those workers run on CPU; the
tenant cache still refuses algorithms with a draft model (``server/speculative.py``).
"""

from __future__ import annotations

import ctypes
import sys
import types
from collections.abc import Callable

import torch

SPECULATIVE_MODULE = "sgl_kernel.speculative"


def install(stub: types.ModuleType) -> None:
    """Put the stand-ins on the ``sgl_kernel`` stand-in module ``stub`` (idempotent)."""
    for name, fn in STANDINS.items():
        setattr(stub, name, fn)
    spec = sys.modules.get(SPECULATIVE_MODULE)
    if spec is None:
        spec = types.ModuleType(SPECULATIVE_MODULE)
        spec.__doc__ = "sglang-iso stand-in: torch versions of the speculative ops."
        sys.modules[SPECULATIVE_MODULE] = spec
    spec.reconstruct_indices_from_tree_mask = reconstruct_indices_from_tree_mask  # type: ignore[attr-defined]
    stub.speculative = spec  # type: ignore[attr-defined]


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write ``out_cache_loc`` (packed, request after request) into ``req_to_token[row, start:end]``."""
    del pool_len  # the row length; req_to_token carries it
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = max(int(end) - int(start), 0)
        req_to_token[row, start : start + n] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Gather ``req_to_token[row, start:end]`` of each request into ``out_cache_loc``, packed."""
    del pool_len
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = max(int(end) - int(start), 0)
        out_cache_loc[offset : offset + n] = req_to_token[row, start : start + n].to(out_cache_loc.dtype)
        offset += n


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """Copy each request's ``topk * num_cols`` slots from ``seq_lens`` on into ``out_cache_loc[i * width:]``."""
    del pool_len
    width = topk * num_cols
    for i, (row, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[row, start : start + width].to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus_tokens[i]`` = the last accepted token of request i (``accept_lens`` includes it)."""
    flat = accept_tokens.reshape(-1)
    idx = torch.arange(accept_lens.numel(), device=flat.device) * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens.copy_(flat[idx].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """Pack ``out_cache_loc[accept_index]`` over the accepted (``!= -1``) entries, in order."""
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every KV buffer (base address, bytes per slot): copy slot ``src_loc[j]`` to ``tgt_loc[j]``.

    NOTE: all sources are read before any target is written (as the Triton kernel does per tile), so
    overlapping moves are safe.
    """
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    slots = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (slots * int(stride))).from_address(int(ptr))
        view = torch.frombuffer(raw, dtype=torch.uint8).view(slots, int(stride))
        view[tgt] = view[src]


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification: walk each request's draft tree from the root, following the child whose
    token equals the target's prediction at the last accepted node; write the accepted path."""
    bs = candidates.shape[0]
    steps = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[b][cur]
            want = target[last]
            while cur != -1 and cand[b][cur] != want:
                cur = sib[b][cur]
            if cur == -1:
                break
            predicts[last] = want
            accepted += 1
            accept_index[b, accepted] = ridx[b][cur]
            last = ridx[b][cur]
        accept_token_num[b] = accepted
        predicts[last] = target[last]


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from the ancestor mask ``tree_mask[b, i, j]`` (j is an ancestor of i):
    depth-based positions, the parent of each node (its deepest strict ancestor), first child and next
    sibling links, -1 where there is none."""
    if batch_size == 0:
        return
    n = draft_token_num
    mask = tree_mask[: batch_size * n * n].reshape(batch_size, n, n).to(torch.bool)
    order = torch.arange(n, device=mask.device)
    anc = mask & (order[None, :] < order[:, None])[None]  # [b, i, j]: strict ancestors
    depth = anc.sum(-1)
    positions[: batch_size * n] = (depth + verified_seq_len[:batch_size, None].to(torch.int64)).reshape(-1)
    retrieve_index[:batch_size] = torch.arange(batch_size * n, device=mask.device).reshape(batch_size, n)
    parent = torch.where(anc, order[None, None, :], torch.full_like(anc, -1, dtype=torch.int64)).amax(-1)
    big = torch.full((), n, device=mask.device, dtype=torch.int64)
    # first child of t: smallest k > t with t an ancestor of k
    child = torch.where(anc, order[None, :, None], big).amin(1)  # [b, t]
    retrieve_next_token[:batch_size] = torch.where(child < n, child, -1)
    same = (parent[:, :, None] == parent[:, None, :]) & (order[:, None] > order[None, :])[None]  # [b, k, t]
    sibling = torch.where(same, order[None, :, None], big).amin(1)
    retrieve_next_sibling[:batch_size] = torch.where((parent >= 0) & (sibling < n), sibling, -1)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """EAGLE draft tree from the top-k parents of each step: per request, the tree mask rows (mode 0: full
    ``[n, seq_len + n]`` rows; mode 1: ``[n, n]``), depth-based positions and the first-child / next-sibling
    links. ``retrieve_next_token`` / ``retrieve_next_sibling`` must come in filled with -1.

    Raises:
        NotImplementedError: the bit-packed mask mode (2), which SGLang's CPU path does not use.
    """
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise NotImplementedError(f"tree_mask_mode {mode} (bit-packed) has no CPU stand-in")
    n = draft_token_num
    seq_lens = verified_seq_len.tolist()
    parents = parent_list.reshape(len(seq_lens), -1).tolist()
    selected = selected_index.reshape(len(seq_lens), -1).tolist()
    nxt, sib = retrieve_next_token.view(-1), retrieve_next_sibling.view(-1)
    mask, pos = tree_mask.view(-1), positions.view(-1)
    prefix = 0
    for b, seq_len in enumerate(seq_lens):
        sel, par = selected[b], parents[b]

        def position_of(token: int, sel: list[int] = sel) -> int | None:
            return next((p for p in range(n - 1) if sel[p] == token), None)

        pos[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            retrieve_index.view(-1)[b * n + i] = b * n + i
            parent_tb = sel[i - 1] // topk
            found = None if parent_tb == 0 else position_of(par[parent_tb])
            if parent_tb != 0 and found is None:
                continue  # parent not among the selected tokens: no link
            head = b * n + (0 if found is None else found + 1)  # the root, or the parent's node
            old = int(nxt[head])
            nxt[head] = i
            if old != -1:
                sib[b * n + i] = old
        retrieve_index.view(-1)[b * n] = b * n
        # first mask cell of node x's row, past its own diagonal cell: full rows span the prompt too
        full_base = n * n * b + prefix * n + seq_len + 1
        for x in range(n):
            row = full_base + (seq_len + n) * x if mode == 0 else n * n * b + n * x + 1
            mask[row - 1] = True
            mask[row : row + n - 1] = False
            if x == 0:
                continue
            cur, steps = x - 1, 0
            for _ in range(depth):
                steps += 1
                mask[row + cur] = True
                parent_tb = sel[cur] // topk
                if parent_tb == 0:
                    break
                found = position_of(par[parent_tb])
                if found is None:
                    break
                cur = found
            pos[b * n + x] = steps + seq_len
        prefix += seq_len


STANDINS: dict[str, Callable[..., None]] = {
    "build_tree_kernel_efficient_cpu": build_tree_kernel_efficient_cpu,
    "assign_draft_cache_locs_contiguous_cpu": assign_draft_cache_locs_contiguous_cpu,
    "assign_extend_cache_locs_cpu": assign_extend_cache_locs_cpu,
    "assign_req_to_token_pool_cpu": assign_req_to_token_pool_cpu,
    "copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache_cpu,
    "fill_accept_out_cache_loc_cpu": fill_accept_out_cache_loc_cpu,
    "fill_bonus_tokens_cpu": fill_bonus_tokens_cpu,
    "verify_tree_greedy_cpu": verify_tree_greedy_cpu,
}
