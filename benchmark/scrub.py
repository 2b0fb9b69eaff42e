"""Scrub cost: kernel bandwidth, and serving throughput with scrubbing on vs off, in one run.

1. Kernel: zero a random half of the pages of a KV pool shaped like a real one (every layer's K and V) with
   ``scrub_pages``; report achieved bandwidth (bytes zeroed / s) as a fraction of the same bytes written by a
   plain ``zero_()`` memset on CPU, or by a device-to-device copy on a GPU.
2. Serving: sglang-iso on the bundled model with ``--kv-scrub on-free`` and with ``--kv-scrub off``, same
   workload (``benchmark/serving.py``'s), side by side; ratios printed (target >= 0.97x throughput).

    python benchmark/scrub.py [--layers 32 --pages 2048 --page-size 16] [--skip-serving]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_iso.platform import bootstrap  # noqa: E402

bootstrap.apply()

import torch  # noqa: E402
from benchmark.serving import SIZES, TextMaker, make_workload, run_level, summarize, write_tenants  # noqa: E402

from sglang_iso.models import tiny_model_path  # noqa: E402
from sglang_iso_kernels import scrub_pages  # noqa: E402
from sglang_iso_testing.process import ServerProcess, free_port, iso_server_argv  # noqa: E402


def kernel_bench(layers: int, pages: int, page_size: int, heads: int, head_dim: int, repeats: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    slots = (pages + 1) * page_size
    buffers = [torch.ones((slots, heads, head_dim), dtype=dtype, device=device) for _ in range(2 * layers)]
    page_ids = torch.tensor(sorted(random.Random(0).sample(range(1, pages + 1), pages // 2)), device=device)
    page_bytes = page_size * heads * head_dim * buffers[0].element_size()
    total = page_bytes * page_ids.numel() * len(buffers)

    def timed(fn: object) -> float:
        best = float("inf")
        for _ in range(repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            if device == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    scrub_s = timed(lambda: scrub_pages(buffers, page_ids, page_size))
    assert all(int(torch.count_nonzero(b.view(pages + 1, -1)[page_ids])) == 0 for b in buffers)
    flat_s = None
    if device == "cuda":
        # the other Triton layout on the same pages, for comparison (small pages use it by default)
        from sglang_iso_kernels import _scrub_triton

        chosen = _scrub_triton._ROWS_MIN_WORDS
        _scrub_triton._ROWS_MIN_WORDS = 1 << 62
        for b in buffers:
            b.fill_(1)
        flat_s = timed(lambda: scrub_pages(buffers, page_ids, page_size))
        _scrub_triton._ROWS_MIN_WORDS = chosen
        assert all(int(torch.count_nonzero(b.view(pages + 1, -1)[page_ids])) == 0 for b in buffers)
    flat = torch.empty(total // buffers[0].element_size(), dtype=dtype, device=device)
    if device == "cuda":
        src = torch.ones_like(flat)
        base_s, base_name = timed(lambda: flat.copy_(src)), "device-to-device copy"
    else:
        base_s, base_name = timed(lambda: flat.zero_()), "memset (zero_) of the same bytes"
    print(f"kernel: {device}, {len(buffers)} buffers, {page_ids.numel()} pages x {page_bytes} B = {total / 1e9:.3f} GB")
    print(f"  scrub_pages  {scrub_s * 1e3:8.2f} ms  {total / scrub_s / 1e9:7.2f} GB/s")
    if flat_s is not None:
        speedup = flat_s / scrub_s
        print(f"  flat layout  {flat_s * 1e3:8.2f} ms  {total / flat_s / 1e9:7.2f} GB/s  (scrub_pages {speedup:.2f}x)")
    print(f"  baseline     {base_s * 1e3:8.2f} ms  {total / base_s / 1e9:7.2f} GB/s  ({base_name})")
    print(f"  fraction of baseline bandwidth: {base_s / scrub_s:.2f}")


def serving_bench(requests: int, concurrency: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="sglang-iso-scrub-"))
    tenants_file, keys = write_tenants(workdir, 4)
    results = {}
    for mode in ("off", "on-free"):
        port = free_port()
        argv = iso_server_argv(port, tiny_model_path(), *SIZES, "--tenants-file", str(tenants_file), "--kv-scrub", mode)
        server = ServerProcess(argv, port).start(timeout_s=600)
        try:
            warm = make_workload(TextMaker(random.Random("warm")), requests=8, groups=2, prefix_tokens=512,
                                 suffix_tokens=64)  # fmt: skip
            asyncio.run(run_level(server.base_url, list(keys), warm, concurrency, 32))
            work = make_workload(TextMaker(random.Random(1)), requests=requests, groups=4, prefix_tokens=512,
                                 suffix_tokens=64)  # fmt: skip
            out, wall = asyncio.run(run_level(server.base_url, list(keys), work, concurrency, 32))
            results[mode] = summarize(out, wall)
        finally:
            server.stop()
    print("serving, 4 tenants, scrub on-free vs off (same workload):")
    print("| metric | off | on-free | on/off |\n|---|---|---|---|")
    for metric in ("req_s", "out_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_mean_ms"):
        off, on = results["off"][metric], results["on-free"][metric]
        print(f"| {metric} | {off:.1f} | {on:.1f} | {on / off:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--pages", type=int, default=512)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--skip-serving", action="store_true")
    args = parser.parse_args()
    kernel_bench(args.layers, args.pages, args.page_size, args.heads, args.head_dim, args.repeats)
    if not args.skip_serving:
        serving_bench(args.requests, args.concurrency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
