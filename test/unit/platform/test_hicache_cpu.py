"""The CPU shim for upstream HiCache: a torch transfer_kv_direct and unpinned MHA host pools, only without CUDA."""

from __future__ import annotations

import importlib

import torch

from sglang_iso.platform import hicache_cpu


def test_transfer_kv_direct_copies_token_rows_per_buffer() -> None:
    src = [torch.arange(40, dtype=torch.float32).view(10, 2, 2), -torch.arange(40, dtype=torch.float32).view(10, 2, 2)]
    dst = [torch.zeros(6, 2, 2), torch.zeros(6, 2, 2)]
    hicache_cpu.transfer_kv_direct(src, dst, torch.tensor([4, 5, 8, 9]), torch.tensor([0, 1, 2, 3]), page_size=2)
    for s, d in zip(src, dst, strict=True):
        assert torch.equal(d[:4], s[torch.tensor([4, 5, 8, 9])])
        assert not d[4:].any()  # rows not named stay untouched


def test_host_pool_module_is_patched_on_import() -> None:
    assert not torch.cuda.is_available()
    assert hicache_cpu.apply() and hicache_cpu.apply()  # active and idempotent
    module = importlib.import_module(hicache_cpu.HOST_POOL_MODULE)
    assert module.transfer_kv_direct is hicache_cpu.transfer_kv_direct
    assert getattr(module.MHATokenToKVPoolHost.__init__, "__sglang_iso_unpinned__", False)
