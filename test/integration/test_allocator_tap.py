"""The allocator tap on real SGLang allocators (CPU): one wrapping, layers in their declared order.

The PD quarantine, the owner table and the scrubber subscribe to the same instance methods; whatever order
they install in, a release runs quarantine -> owner -> scrub -> SGLang, and each method is replaced once.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

from sglang_iso.integration import allocator_tap
from sglang_iso.integration.allocator_tap import RELEASE, Order
from sglang_iso.integration.owner_check import OwnerTable
from sglang_iso.integration.pd_transfer import PdGuard
from sglang_iso.integration.scrub import KvScrubber

SIZE = 32


def make(page_size: int) -> tuple[Any, ReqToTokenPool, MHATokenToKVPool]:
    kv = MHATokenToKVPool(size=SIZE, page_size=page_size, dtype=torch.float32, head_num=1, head_dim=2, layer_num=1,
                          device="cpu", enable_memory_saver=False)  # fmt: skip
    if page_size == 1:
        allocator: Any = TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", kv, need_sort=False)
    else:
        allocator = PagedTokenToKVPoolAllocator(SIZE, page_size, torch.float32, "cpu", kv, need_sort=False)
    rows = ReqToTokenPool(size=4, max_context_len=SIZE, device="cpu", enable_memory_saver=False)
    return allocator, rows, kv


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("install_order", ["scrub-owner-pd", "pd-owner-scrub"])
def test_layers_run_in_declared_order_whatever_the_install_order(page_size: int, install_order: str) -> None:
    allocator, rows, kv = make(page_size)
    release_name = allocator_tap.allocator_release_name(allocator)
    sglang_release = getattr(allocator, release_name)
    cache = SimpleNamespace(token_to_kv_pool_allocator=allocator, req_to_token_pool=rows, device="cpu")
    installers = {
        "scrub": lambda: KvScrubber(allocator, rows).install(),
        "owner": lambda: OwnerTable(cache).install(),
        "pd": lambda: PdGuard(allocator, b"k" * 32, "decode", 5.0).install(),
    }
    made = {name: installers[name]() for name in install_order.split("-")}
    scrubber, owners, pd = made["scrub"], made["owner"], made["pd"]
    tap = allocator_tap.tap_of(allocator)
    assert tap.orders(RELEASE) == [Order.QUARANTINE, Order.OWNER, Order.SCRUB]
    assert tap.orders("clear") == [Order.QUARANTINE, Order.OWNER]
    assert allocator_tap.tap_of(rows).orders("free_rows") == [Order.OWNER, Order.SCRUB]

    seen: list[str] = []  # which layer saw a non-empty release, in call order
    for name, obj, method in (
        ("pd", pd, "_release"),
        ("owner", owners, "_release_paged" if page_size > 1 else "_free"),
        ("scrub", scrubber, "_release_paged" if page_size > 1 else "_free"),
    ):
        layer = getattr(obj, method)

        def spy(below: Any, *args: Any, _name: str = name, _layer: Any = layer) -> Any:
            if any(a.numel() for a in args):  # NOTE: page 1 passes an emptied tensor on, as SGLang's free allows
                seen.append(_name)
            return _layer(below, *args)

        tap._layers[release_name] = [(o, spy if fn == layer else fn) for o, fn in tap._layers[release_name]]
    reached: list[bool] = []

    def sglang(*args: Any) -> Any:
        if any(a.numel() for a in args):
            reached.append(True)
        return sglang_release(*args)

    tap._originals[release_name] = sglang
    tap.rebuild(release_name)
    slots = allocator.alloc(2 * page_size)
    kv.k_buffer[0][slots] = 5.0
    pd.fence("t", slots)
    allocator.free(slots)
    assert seen == ["pd"] and not reached, "a fenced page went past the quarantine"
    assert scrubber.status()["pending_pages"] == 0
    pd.succeeded("t")  # released below the quarantine: owner table, scrubber, SGLang
    assert seen == ["pd", "owner", "scrub"] and reached == [True]
    assert scrubber.status()["pending_pages"] == 2  # slots (page 1) or page ids (paged)
    assert bool((owners.page_owner[slots // page_size] == -1).all())
    allocator.alloc(page_size)  # any hand-out: the scrubber zeroes the pending pages first
    assert bool(torch.all(kv.k_buffer[0][slots] == 0))


def test_one_layer_per_order_and_call_below_skips_the_outer_layers() -> None:
    calls: list[str] = []
    target = SimpleNamespace(work=lambda x: calls.append(f"sglang {x}") or x)
    tap = allocator_tap.tap_of(target)

    def layer(tag: str) -> Any:
        def run(below: Any, x: int) -> Any:
            calls.append(tag)
            return below(x + 1)

        return run

    tap.subscribe("work", Order.SCRUB, layer("scrub"))
    captured = target.work  # (code holding the method from before a later subscription)
    tap.subscribe("work", Order.QUARANTINE, layer("pd"))
    with pytest.raises(ValueError, match="SCRUB is already subscribed"):
        tap.subscribe("work", Order.SCRUB, layer("again"))
    assert target.work(0) == 2 and calls == ["pd", "scrub", "sglang 2"]
    calls.clear()
    assert captured(0) == 2 and calls == ["pd", "scrub", "sglang 2"], "a later layer must reach earlier holders"
    calls.clear()
    assert tap.call_below("work", Order.QUARANTINE, 0) == 1 and calls == ["scrub", "sglang 1"]
    assert allocator_tap.tap_of(target) is tap
