"""Owner check cost: per forward against pool size and batch size, and serving with the check on vs off.

1. Per forward (no server): a decode batch of ``B`` requests with ``--context`` tokens each over a KV pool of
   ``P`` slots. ``off`` = the row gather every attention backend does anyway (``req_to_token[rows, :len]`` into
   one index stream); ``on`` = ``sanitize_rows`` (the check sglang-iso runs before every forward) plus the same
   gather. Times are the median of ``--repeats`` (CUDA-synchronized on a GPU). Goal: ``on - off`` flat in ``P``.
2. Serving (real servers, one at a time): upstream SGLang, sglang-iso with ``--kv-owner-check off`` and
   ``on``, all with ``--max-total-tokens --serving-pool``: median latency of one repeated
   ``--repeat-tokens``-token prompt (a cache hit after the first), and throughput of a shared-prefix workload
   (``benchmark/serving.py``'s) at ``--concurrency``. Ratios on/off and on/upstream are printed. Goals: repeated
   request on/off <= 1.15 at an 8M-slot pool; throughput on/off >= 0.97.

    python benchmark/owner_check.py                     # full run (sizes for a GPU)
    python benchmark/owner_check.py --pools 65536,1048576 --batches 1,16 --context 256 --repeats 3 \\
        --serving-pool 65536 --requests 8 --repeat-count 4      # brief CPU run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "python", ROOT / "sgl-kernel-patches"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402

from sglang_iso_kernels import sanitize_rows  # noqa: E402

FREE, ZERO_OWNER, ZERO_PAGE = -1, 0, 0
SERVERS = ("upstream", "iso-off", "iso-on")


# ------------------------------------------------------------------------------------------------ per forward


def _median_s(fn: Callable[[], object], repeats: int, cuda: bool) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call warms up (and compiles Triton on a GPU)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def forward_cell(
    pool: int, batch: int, context: int, page_size: int, repeats: int, device: torch.device
) -> dict[str, float]:
    """Time one (pool, batch) cell; every row holds only its own pages (the check finds nothing)."""
    cuda = device.type == "cuda"
    num_pages = pool // page_size + 2
    pages_per_req = -(-context // page_size)
    if batch * pages_per_req > num_pages - 2:
        raise ValueError(f"pool {pool} too small for {batch} x {context} tokens")
    gen = torch.Generator().manual_seed(pool * 1000 + batch)
    pages = (torch.randperm(num_pages - 2, generator=gen)[: batch * pages_per_req] + 1).view(batch, pages_per_req)
    slots = (pages[:, :, None] * page_size + torch.arange(page_size)).view(batch, -1)[:, :context]
    owners = torch.arange(batch, dtype=torch.int32) % 8 + 1  # 8 tenants
    page_owner = torch.full((num_pages,), FREE, dtype=torch.int32)
    page_owner[pages.reshape(-1)] = owners.repeat_interleave(pages_per_req)
    page_owner[ZERO_PAGE] = ZERO_OWNER
    req_to_token = torch.zeros((batch + 1, context), dtype=torch.int32)
    req_to_token[1:] = slots.to(torch.int32)
    row_owner = torch.full((batch + 1,), FREE, dtype=torch.int32)
    row_owner[1:] = owners
    allowed = torch.full((16, 1), ZERO_OWNER, dtype=torch.int32)
    page_owner, req_to_token, row_owner, allowed = (
        t.to(device) for t in (page_owner, req_to_token, row_owner, allowed)
    )
    rows = torch.arange(1, batch + 1, device=device)
    seq_lens = torch.full((batch,), context, dtype=torch.int64, device=device)
    write_start = seq_lens - 1
    total = batch * context

    def gather() -> torch.Tensor:
        return req_to_token[rows, :context].reshape(-1)

    def check() -> torch.Tensor:
        return sanitize_rows(
            req_to_token, rows, seq_lens, write_start, page_owner, row_owner, allowed,
            page_size=page_size, zero_page=ZERO_PAGE, total_tokens=total,
        )  # fmt: skip

    out = {"tokens": float(total), "off_ms": 1e3 * _median_s(gather, repeats, cuda)}
    out["on_ms"] = 1e3 * _median_s(lambda: (check(), gather()), repeats, cuda)
    found = int(check().sum())
    if found:
        raise RuntimeError(f"benchmark rows are clean but the check refused {found} slots")
    return out


def forward_bench(args: argparse.Namespace) -> list[dict[str, float]]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and args.cpu_threads > 0:
        # NOTE: one thread, because on a shared CPU box intra-op threads get preempted in scheduler-tick steps
        # that swamp sub-millisecond timings.
        torch.set_num_threads(args.cpu_threads)
    pools = [int(p) for p in args.pools.split(",") if p]
    batches = [int(b) for b in args.batches.split(",") if b]
    pages_per_req = -(-args.context // args.page_size)
    cells = [(p, b) for p in pools for b in batches if b * pages_per_req <= p // args.page_size]
    print(f"per forward on {device}: pools {pools} x batches {batches}, {args.context} tokens per request", flush=True)
    for p, b in ((p, b) for p in pools for b in batches if (p, b) not in cells):
        print(f"  pool={p} batch={b}: skipped ({b} x {args.context} tokens do not fit in the pool)", flush=True)
    results, t0 = [], time.monotonic()
    for i, (pool, batch) in enumerate(cells, 1):
        cell = forward_cell(pool, batch, args.context, args.page_size, args.repeats, device)
        results.append({"pool": float(pool), "batch": float(batch), **cell})
        elapsed = time.monotonic() - t0
        eta = elapsed / i * (len(cells) - i)
        rate = f"{i / elapsed:.2f} cells/s, ETA {eta:.0f}s"
        print(f"  [{i}/{len(cells)}] pool={pool} batch={batch}: {_fmt(cell)} ({rate})", flush=True)
    return results


def _fmt(cell: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.3f}" for k, v in cell.items() if k != "tokens")


def forward_table(results: list[dict[str, float]]) -> str:
    rows = ["| pool slots | batch | tokens | off ms | on ms | on/off | check ms |", "|---" * 7 + "|"]
    for r in results:
        rows.append(
            f"| {int(r['pool']):,} | {int(r['batch'])} | {int(r['tokens']):,} | {r['off_ms']:.3f} | {r['on_ms']:.3f} | "
            f"{r['on_ms'] / r['off_ms']:.2f} | {r['on_ms'] - r['off_ms']:.3f} |"
        )
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------ serving


def serving_bench(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    import asyncio
    import random
    import tempfile

    from benchmark.serving import TextMaker, make_workload, one_request, run_level, summarize, write_tenants

    from sglang_iso.models import tiny_model_path
    from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port, iso_server_argv

    sizes = ("--max-total-tokens", str(args.serving_pool), "--max-running-requests", "16", "--enable-cache-report")
    maker = TextMaker(random.Random(args.seed))
    repeated = maker.text(args.repeat_tokens)
    work = make_workload(maker, requests=args.requests, groups=4, prefix_tokens=1024, suffix_tokens=128)
    runs: dict[str, list[dict[str, float]]] = {}
    names = args.servers.split(",")
    with tempfile.TemporaryDirectory(prefix="sglang-iso-owner-bench-") as tmp:
        tenants_file, keys = write_tenants(Path(tmp), 4)
        # NOTE: the servers take turns, round after round (one alive at a time), and each metric is the median
        # over rounds: on a shared CPU host one run of each drifts by more than the few percent compared here.
        for rnd, name in ((r, n) for r in range(args.rounds) for n in names):
            port, model = free_port(), tiny_model_path()
            if name == "upstream":
                argv, use = baseline_server_argv(port, model, *sizes), [None]
            else:
                mode = name.removeprefix("iso-")
                argv = iso_server_argv(
                    port, model, *sizes, "--tenants-file", str(tenants_file), "--kv-owner-check", mode
                )
                use = list(keys)
            t0 = time.monotonic()
            server = ServerProcess(argv, port).start(timeout_s=600)
            try:
                latencies = asyncio.run(_repeat(one_request, server.base_url, use[0], repeated, args.repeat_count))
                results, wall = asyncio.run(run_level(server.base_url, use, work, args.concurrency, 16))
            finally:
                server.stop()
            cell = {"repeat_p50_ms": 1e3 * statistics.median(latencies), **summarize(results, wall)}
            runs.setdefault(name, []).append(cell)
            took = time.monotonic() - t0
            print(f"  round {rnd + 1}/{args.rounds} {name}: {_fmt(cell)} ({took:.0f}s with start-up)", flush=True)
    return {name: {k: statistics.median(c[k] for c in cells) for k in cells[0]} for name, cells in runs.items()}


async def _repeat(one_request: Callable, url: str, key: str | None, prompt: str, count: int) -> list[float]:  # type: ignore[type-arg]
    import aiohttp

    latencies = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for i in range(count + 1):  # the first one fills the cache
            t0 = time.perf_counter()
            await one_request(session, url, key, prompt, 4)
            if i:
                latencies.append(time.perf_counter() - t0)
    return latencies


def serving_table(out: dict[str, dict[str, float]]) -> str:
    keys = (("repeat_p50_ms", "repeated request p50 ms"), ("req_s", "req/s"), ("out_tok_s", "out tok/s"))
    head = "| metric | " + " | ".join(out) + " | on/off | on/upstream |"
    rows = [head, "|---" * (len(out) + 3) + "|"]
    for key, label in keys:
        on, off, up = (out.get(s, {}).get(key, float("nan")) for s in ("iso-on", "iso-off", "upstream"))
        vals = " | ".join(f"{out[s][key]:.2f}" for s in out)
        rows.append(f"| {label} | {vals} | {on / off:.3f} | {on / up:.3f} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------ report


def plot(path: Path, forward: list[dict[str, float]], serving: dict[str, dict[str, float]]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2 if serving else 1, figsize=(11 if serving else 6, 4), squeeze=False)
    ax = axes[0][0]
    for batch in sorted({r["batch"] for r in forward}):
        rs = [r for r in forward if r["batch"] == batch]
        ax.plot(
            [r["pool"] for r in rs],
            [max(r["on_ms"] - r["off_ms"], 1e-3) for r in rs],
            "o-",
            label=f"check, B={int(batch)}",
        )
    ax.set(xscale="log", yscale="log", xlabel="KV pool (token slots)", ylabel="ms per forward")
    ax.set_title("owner check cost per forward", fontsize=10)
    ax.legend(fontsize=7)
    if serving:
        ax2 = axes[0][1]
        names = list(serving)
        ax2.bar(names, [serving[n]["repeat_p50_ms"] for n in names])
        ax2.set_title("repeated request, p50 ms (lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pools", default="65536,1048576,8388608,33554432", help="KV pool sizes (token slots)")
    p.add_argument("--batches", default="1,16,64,256", help="requests per forward")
    p.add_argument("--context", type=int, default=1536, help="tokens per request")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--cpu-threads", type=int, default=1, help="torch threads for the per-forward part on CPU")
    p.add_argument("--skip-serving", action="store_true")
    p.add_argument("--serving-pool", type=int, default=8388608, help="--max-total-tokens of the serving runs")
    p.add_argument("--servers", default=",".join(SERVERS), help=f"subset of {','.join(SERVERS)}")
    p.add_argument("--repeat-tokens", type=int, default=1536)
    p.add_argument("--repeat-count", type=int, default=10)
    p.add_argument("--requests", type=int, default=128, help="shared-prefix workload requests")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="serving runs per server, in rotation (medians reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="benchmark/owner_check.png", help="PNG path (needs matplotlib); '' for none")
    p.add_argument("--json", default="", help="also write the raw numbers here")
    args = p.parse_args(argv)
    if set(args.servers.split(",")) - set(SERVERS):
        p.error(f"--servers takes names from {SERVERS}")
    forward = forward_bench(args)
    print(forward_table(forward), flush=True)
    serving: dict[str, dict[str, float]] = {}
    if not args.skip_serving:
        print(f"serving: {args.servers} at a {args.serving_pool:,}-slot pool, {args.rounds} rounds", flush=True)
        serving = serving_bench(args)
        print(serving_table(serving))
    if args.json:
        Path(args.json).write_text(json.dumps({"forward": forward, "serving": serving}, indent=1))
    if args.plot and plot(Path(args.plot), forward, serving):
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
