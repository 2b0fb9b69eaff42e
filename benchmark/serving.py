"""Serving benchmark: upstream SGLang vs sglang-iso, same bundled model, same workload, one run.

Usage::

    python benchmark/serving.py [--requests N] [--concurrency 1,4] [--tenants 4] [--prefix-tokens 1024] ...
    python benchmark/serving.py --family deepseek ...   # MLA + MoE (a tiny DeepSeek-V3-shaped model)
    python benchmark/serving.py --family laguna ...     # SWA hybrid (sliding and full attention layers)
    python benchmark/serving.py --family gpt-oss ...    # SWA hybrid with attention sinks and MoE (Triton, interpreted)
    python benchmark/serving.py --family qwen3-next ... # hybrid linear attention (GDN state), MoE (torch gate on CPU)
    python benchmark/serving.py --family nemotron-h ... # hybrid Mamba2 (convolution and SSM state), attention, MLP

Workloads ("generated shared prefix": a long shared prefix + a random suffix per request; or conversations):

* ``single``: one API key; ``--tenants`` shared prefixes, requests spread over them;
* ``multi``: ``--tenants`` keys, one tenant per prefix (sglang-iso keeps one namespace per tenant);
* ``conversation``: each client holds a conversation of its own under the next tenant's key: a first prompt of
  ``--prefix-tokens``, then turns that send the previous prompt, its reply and ``--suffix-tokens`` new tokens
  (token ids through streaming ``/generate``, so a turn continues exactly the previous exchange). Reuse is then the
  previous exchange: what a hybrid linear-attention model caches (its state at the end of an exchange).

Upstream runs without keys (one trust domain), so both servers see the same prompts and reuse the same
prefixes; only the keying differs. Servers run one at a time (an idle SGLang scheduler busy-polls about half a
core on CPU), each started once, warmed up with unrelated prompts, then every workload x concurrency level
runs as a closed loop: ``concurrency`` streaming clients (asyncio + aiohttp) send ``/v1/completions`` with
``ignore_eos`` so every response has exactly ``--output-tokens`` tokens.

Metrics: req/s and output tok/s over the wall time of the level; TTFT p50/p99 (first streamed token); ITL mean
(gap between later tokens); hit % (cached / prompt tokens, from ``--enable-cache-report``); and the machine's
1-minute load average at the end of each level, because on a shared machine other processes move every number.

The SWA hybrid families run in the one-pool layout on both servers (``--disable-hybrid-swa-memory``: sglang-iso's
launcher adds it, upstream gets it here), so both keep the same KV and compare the same attention path: upstream's
default SWA sub-pool layout is not served on torch_native (its sliding layers read untranslated ids), and gpt-oss
needs the Triton backend for its sinks, run on CPU in Triton's interpreter (``TRITON_INTERPRET=1``, both servers):
use few requests there. The hybrid linear-attention family (a tiny Qwen3-Next, seeded weights) runs with the
state-cache strategy sglang-iso serves (``--mamba-radix-cache-strategy no_buffer`` on both): its state is cached
only at the end of a finished exchange, so a shared prefix followed by a new suffix misses on both servers (hit %
near 0: the miss path, with the namespace check, state and KV scrub and both owner checks), and the
``conversation`` workload measures its same-tenant hits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import tokenizers

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import key_sha256, new_api_key
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port, iso_server_argv
from sglang_iso_testing.tiny_deepseek import write_tiny_deepseek
from sglang_iso_testing.tiny_gpt_oss import SERVE_FLAGS as GPT_OSS_FLAGS
from sglang_iso_testing.tiny_gpt_oss import write_tiny_gpt_oss
from sglang_iso_testing.tiny_nemotron_h import write_tiny_nemotron_h
from sglang_iso_testing.tiny_qwen3_next import SERVE_FLAGS as QWEN3_NEXT_FLAGS
from sglang_iso_testing.tiny_qwen3_next import write_tiny_qwen3_next
from sglang_iso_testing.tiny_swa import DTYPE_FLAGS as LAGUNA_FLAGS
from sglang_iso_testing.tiny_swa import write_tiny_swa


@dataclass(frozen=True)
class Family:
    """A model family: how to get its model directory and what both servers need to serve it."""

    write: Callable[[Path], Path] | None
    """Writes a tiny model of the family into a directory; None: the bundled model."""
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


_ONE_POOL = ("--disable-hybrid-swa-memory",)
FAMILIES = {
    "llama": Family(None),
    "deepseek": Family(write_tiny_deepseek),
    "laguna": Family(write_tiny_swa, (*LAGUNA_FLAGS, *_ONE_POOL)),
    "gpt-oss": Family(write_tiny_gpt_oss, (*GPT_OSS_FLAGS, *_ONE_POOL), (("TRITON_INTERPRET", "1"),)),
    "qwen3-next": Family(write_tiny_qwen3_next, QWEN3_NEXT_FLAGS),
    "nemotron-h": Family(write_tiny_nemotron_h, QWEN3_NEXT_FLAGS),
}
SIZES = ("--max-total-tokens", "32768", "--max-running-requests", "16", "--enable-cache-report")
"""Same KV pool and batch limits for both servers."""
SERVERS = ("upstream", "iso")
WORKLOADS = ("single", "multi", "conversation")
METRICS = (  # (key, label, higher is better)
    ("req_s", "req/s", True),
    ("out_tok_s", "out tok/s", True),
    ("ttft_p50_ms", "TTFT p50 ms", False),
    ("ttft_p99_ms", "TTFT p99 ms", False),
    ("itl_mean_ms", "ITL mean ms", False),
    ("hit_pct", "hit %", True),
    ("load_1m", "machine load (1 min avg)", False),
)
"""The last row is not a result: the machine's load average at the end of the level (others' processes)."""


# ------------------------------------------------------------------------------------------------ workload


@dataclass(frozen=True)
class Conversation:
    tenant: int
    first: list[int]
    """The first prompt's token ids."""
    turns: list[list[int]]
    """The new token ids each later turn adds after the previous prompt and its reply."""


def make_conversations(
    maker: TextMaker, *, requests: int, clients: int, prefix_tokens: int, suffix_tokens: int
) -> list[Conversation]:
    """``clients`` conversations of ``requests // clients`` turns each (at least one), client i under tenant i."""
    turns = max(1, requests // clients)
    ids = [maker.tok.encode(maker.text(prefix_tokens)).ids for _ in range(clients)]
    return [
        Conversation(i, ids[i], [maker.tok.encode(" " + maker.text(suffix_tokens)).ids for _ in range(turns - 1)])
        for i in range(clients)
    ]


@dataclass(frozen=True)
class Request:
    tenant: int
    """Index of the key (multi) or of the shared prefix (single)."""
    prompt: str


class TextMaker:
    """Random lowercase words, cut to about a number of tokens of the bundled model's tokenizer."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.tok = tokenizers.Tokenizer.from_file(str(tiny_model_path() / "tokenizer.json"))

    def text(self, tokens: int) -> str:
        words: list[str] = []
        for _ in range(tokens):  # bounded: every word is at least one token
            words += [self._word() for _ in range(8)]
            if len(self.tok.encode(" ".join(words)).ids) >= tokens:
                break
        while len(words) > 1 and len(self.tok.encode(" ".join(words[:-1])).ids) >= tokens:
            words.pop()
        return " ".join(words)

    def _word(self) -> str:
        return "".join(self.rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(self.rng.randint(2, 8)))


def make_workload(
    maker: TextMaker, *, requests: int, groups: int, prefix_tokens: int, suffix_tokens: int
) -> list[Request]:
    """``requests`` prompts over ``groups`` shared prefixes, in a seeded random order."""
    prefixes = [maker.text(prefix_tokens) for _ in range(groups)]
    out = [Request(i % groups, prefixes[i % groups] + " " + maker.text(suffix_tokens)) for i in range(requests)]
    maker.rng.shuffle(out)
    return out


# ------------------------------------------------------------------------------------------------ client


@dataclass
class Result:
    ttft_s: float
    itls_s: list[float]
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int


@dataclass
class LevelStats:
    server: str
    workload: str
    concurrency: int
    values: dict[str, float] = field(default_factory=dict)


async def _events(session: aiohttp.ClientSession, url: str, body: dict, headers: dict[str, str]) -> AsyncIterator[dict]:
    """The JSON events of a streamed (server-sent events) response to a POST of ``body``."""
    async with session.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        async for raw in resp.content:
            line = raw.strip()
            if line.startswith(b"data:") and line != b"data: [DONE]":
                yield json.loads(line[5:])


async def one_request(
    session: aiohttp.ClientSession, url: str, key: str | None, prompt: str, out_tokens: int
) -> Result:
    body = {
        "model": "default",
        "prompt": prompt,
        "max_tokens": out_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    start = time.perf_counter()
    token_times: list[float] = []
    usage: dict = {}
    async for event in _events(session, url + "/v1/completions", body, headers):
        if event.get("choices") and event["choices"][0].get("text"):
            token_times.append(time.perf_counter())
        if event.get("usage"):
            usage = event["usage"]
    if not token_times:
        raise RuntimeError("stream carried no token")
    details = usage.get("prompt_tokens_details") or {}
    return Result(
        ttft_s=token_times[0] - start,
        itls_s=[b - a for a, b in itertools.pairwise(token_times)],
        output_tokens=int(usage.get("completion_tokens", len(token_times))),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int(details.get("cached_tokens", 0)),
    )


async def one_turn(
    session: aiohttp.ClientSession, url: str, key: str | None, ids: list[int], out_tokens: int
) -> tuple[Result, list[int]]:
    """A streamed ``/generate`` of ``ids``: the timings and the reply's token ids."""
    sampling = {"max_new_tokens": out_tokens, "temperature": 0, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    start = time.perf_counter()
    token_times: list[float] = []
    last: dict = {}
    seen = 0
    body = {"input_ids": ids, "sampling_params": sampling, "stream": True}
    async for last in _events(session, url + "/generate", body, headers):
        done = int(last.get("meta_info", {}).get("completion_tokens", 0))
        if done > seen:
            token_times.append(time.perf_counter())
            seen = done
    meta = last.get("meta_info", {})
    output = list(last.get("output_ids") or [])
    if not token_times or len(output) != out_tokens:
        raise RuntimeError(f"stream ended with {len(output)} of {out_tokens} output ids")
    result = Result(
        ttft_s=token_times[0] - start,
        itls_s=[b - a for a, b in itertools.pairwise(token_times)],
        output_tokens=len(output),
        prompt_tokens=int(meta.get("prompt_tokens", len(ids))),
        cached_tokens=int(meta.get("cached_tokens", 0)),
    )
    return result, output


async def run_conversations(
    url: str, keys: list[str | None], convs: list[Conversation], out_tokens: int
) -> tuple[list[Result], float]:
    """One client per conversation, its turns in order."""
    results: list[Result] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=len(convs))) as session:

        async def client(conv: Conversation) -> None:
            key = keys[conv.tenant % len(keys)]
            ids = list(conv.first)
            result, reply = await one_turn(session, url, key, ids, out_tokens)
            results.append(result)
            for new in conv.turns:  # bounded: one request per turn
                ids = [*ids, *reply, *new]
                result, reply = await one_turn(session, url, key, ids, out_tokens)
                results.append(result)

        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in convs))
        return results, time.perf_counter() - start


async def run_level(
    url: str, keys: list[str | None], work: list[Request], concurrency: int, out_tokens: int
) -> tuple[list[Result], float]:
    queue = list(reversed(work))
    results: list[Result] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def worker() -> None:
            while queue:  # bounded: pops one of len(work) requests per iteration
                req = queue.pop()
                results.append(await one_request(session, url, keys[req.tenant % len(keys)], req.prompt, out_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results, time.perf_counter() - start


def summarize(results: list[Result], wall_s: float) -> dict[str, float]:
    ttfts = sorted(r.ttft_s for r in results)
    itls = [x for r in results for x in r.itls_s]
    prompt = sum(r.prompt_tokens for r in results)
    return {
        "req_s": len(results) / wall_s,
        "out_tok_s": sum(r.output_tokens for r in results) / wall_s,
        "ttft_p50_ms": 1e3 * statistics.median(ttfts),
        "ttft_p99_ms": 1e3 * ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
        "itl_mean_ms": 1e3 * statistics.fmean(itls) if itls else float("nan"),
        "hit_pct": 100.0 * sum(r.cached_tokens for r in results) / prompt if prompt else float("nan"),
    }


# ------------------------------------------------------------------------------------------------ servers


def write_tenants(directory: Path, n: int) -> tuple[Path, list[str]]:
    """A tenants file with ``n`` private-cache tenants, one key each."""
    (directory / "secret.key").write_bytes(secrets.token_bytes(32))
    keys = [new_api_key() for _ in range(n)]
    lines = ['namespace_secret_file = "secret.key"', f'admin_key_sha256 = ["{key_sha256(new_api_key())}"]', ""]
    for i, key in enumerate(keys):
        lines += ["[[tenants]]", f'id = "bench{i}"', f'key_sha256 = ["{key_sha256(key)}"]', 'cache = "private"', ""]
    path = directory / "tenants.toml"
    path.write_text("\n".join(lines))
    return path, keys


def start(name: str, tenants_file: Path, model: Path, family: Family) -> ServerProcess:
    port = free_port()
    if name == "upstream":
        argv = baseline_server_argv(port, model, *SIZES, *family.flags)
    else:
        argv = iso_server_argv(port, model, *SIZES, *family.flags, "--tenants-file", str(tenants_file))
    return ServerProcess(argv, port, env=dict(family.env)).start(timeout_s=600)


def bench_server(
    name: str,
    args: argparse.Namespace,
    tenants_file: Path,
    iso_keys: list[str],
    workloads: dict[tuple[str, int], list[Request] | list[Conversation]],
    levels: list[int],
) -> list[LevelStats]:
    server = start(name, tenants_file, args.model_dir, FAMILIES[args.family])
    out: list[LevelStats] = []
    try:
        keys: list[str | None] = list(iso_keys) if name == "iso" else [None]
        # Warm-up shaped like the workload (prefill of a full prompt, then cached-prefix requests, same output
        # length and concurrency), with its own prompts: the first requests after start-up are slow on CPU.
        warm_maker = TextMaker(random.Random(f"warm-{args.seed}"))
        warm_work = make_workload(
            warm_maker,
            requests=4 * max(levels),
            groups=2,
            prefix_tokens=args.prefix_tokens,
            suffix_tokens=args.suffix_tokens,
        )
        asyncio.run(run_level(server.base_url, keys, warm_work, max(levels), args.output_tokens))
        for (workload, concurrency), work in workloads.items():
            # single: one key; multi: one key per tenant (upstream: no key either way).
            use = keys[:1] if workload == "single" else keys
            if workload == "conversation":
                convs = [w for w in work if isinstance(w, Conversation)]
                results, wall = asyncio.run(run_conversations(server.base_url, use, convs, args.output_tokens))
            else:
                reqs = [w for w in work if isinstance(w, Request)]
                results, wall = asyncio.run(run_level(server.base_url, use, reqs, concurrency, args.output_tokens))
            stats = LevelStats(name, workload, concurrency, summarize(results, wall) | {"load_1m": os.getloadavg()[0]})
            values = ", ".join(f"{k}={v:.1f}" for k, v in stats.values.items())
            print(f"  {name:8s} {workload:6s} c={concurrency}: {values}", flush=True)
            out.append(stats)
    finally:
        server.stop()
    return out


# ------------------------------------------------------------------------------------------------ report


def table(stats: list[LevelStats]) -> str:
    by = {(s.server, s.workload, s.concurrency): s.values for s in stats}
    head = "| workload | conc | metric | upstream | iso | iso/upstream |\n|---|---|---|---|---|---|"
    rows = [head]
    for workload, conc in dict.fromkeys((s.workload, s.concurrency) for s in stats):
        up, iso = by.get(("upstream", workload, conc)), by.get(("iso", workload, conc))
        if up is None or iso is None:
            continue
        for key, label, _ in METRICS:
            ratio = iso[key] / up[key] if up[key] else float("nan")
            rows.append(f"| {workload} | {conc} | {label} | {up[key]:.1f} | {iso[key]:.1f} | {ratio:.2f} |")
    return "\n".join(rows)


def plot(path: Path, stats: list[LevelStats]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    configs = list(dict.fromkeys((s.workload, s.concurrency) for s in stats))
    by = {(s.server, s.workload, s.concurrency): s.values for s in stats}
    shown = METRICS[:-2]  # not hit % (equal by construction) nor the load
    fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.8))
    for ax, (key, label, better_high) in zip(axes, shown, strict=True):
        for k, server in enumerate(SERVERS):
            ys = [by.get((server, w, c), {}).get(key, 0.0) for w, c in configs]
            ax.bar([i + 0.4 * k for i in range(len(configs))], ys, 0.4, label=server)
        ax.set_xticks([i + 0.2 for i in range(len(configs))], [f"{w}\nc={c}" for w, c in configs])
        ax.set_title(f"{label} ({'higher' if better_high else 'lower'} is better)", fontsize=9)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=32, help="requests per workload and concurrency level")
    p.add_argument("--concurrency", default="4", help="comma-separated client counts (default %(default)s)")
    p.add_argument("--tenants", type=int, default=4, help="tenant keys (multi) = shared prefixes (both)")
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--suffix-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--workloads", default="single,multi", help=f"subset of {','.join(WORKLOADS)} (%(default)s)")
    p.add_argument("--servers", default=",".join(SERVERS), help=f"subset of {','.join(SERVERS)} (run in this order)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="benchmark/serving.png", help="PNG path (needs matplotlib)")
    p.add_argument("--json", default="", help="also write the raw numbers here")
    p.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        default="llama",
        help="llama: the bundled dense model; deepseek, laguna, gpt-oss, qwen3-next, nemotron-h: a tiny model of that "
        "family written at start",
    )
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c]
    workload_names = [w for w in args.workloads.split(",") if w]
    servers = [s for s in args.servers.split(",") if s]
    if set(workload_names) - set(WORKLOADS) or set(servers) - set(SERVERS) or not levels or min(levels) < 1:
        p.error(f"workloads from {WORKLOADS}, servers from {SERVERS}, concurrency >= 1")
    maker = TextMaker(random.Random(args.seed))
    # NOTE: fresh prompts (and prefixes) per workload and level, so no level starts with the previous one's
    # prefixes cached; the same seeded prompts go to both servers.
    work: dict[tuple[str, int], list[Request] | list[Conversation]] = {}
    for w in workload_names:
        for c in levels:
            sizes = {"prefix_tokens": args.prefix_tokens, "suffix_tokens": args.suffix_tokens}
            if w == "conversation":
                work[w, c] = make_conversations(maker, requests=args.requests, clients=c, **sizes)
            else:
                work[w, c] = make_workload(maker, requests=args.requests, groups=args.tenants, **sizes)
    print(
        f"workloads {workload_names} x concurrency {levels}: {args.requests} requests, {args.tenants} tenants/prefixes"
    )
    stats: list[LevelStats] = []
    with tempfile.TemporaryDirectory(prefix="sglang-iso-bench-") as tmp:
        tenants_file, keys = write_tenants(Path(tmp), args.tenants)
        family = FAMILIES[args.family]
        args.model_dir = tiny_model_path() if family.write is None else family.write(Path(tmp) / args.family)
        print(f"model family {args.family}: {args.model_dir}")
        for name in servers:
            t0 = time.monotonic()
            stats += bench_server(name, args, tenants_file, keys, work, levels)
            print(f"{name}: done in {time.monotonic() - t0:.0f}s (including start-up)", flush=True)
    print(table(stats))
    if args.json:
        Path(args.json).write_text(json.dumps([s.__dict__ for s in stats], indent=1))
    if args.plot and plot(Path(args.plot), stats):
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
