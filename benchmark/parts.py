"""The share of each part of sglang-iso in a request's time: upstream and sglang-iso variants, all alive at once.

Usage::

    python benchmark/parts.py [--rounds 12] [--block 20] [--variants iso,check-off,scrub-off,both-off]
                              [--workload random|shared]

Every server (plain upstream and one sglang-iso per variant, each with a one-tenant tenants file) is started first
and kept running: the harness starts them with ``--sleep-on-idle``, so the idle ones wait on their sockets instead
of busy-polling, and only the one being timed works. Each round sends ``--block`` sequential streamed requests
(``--workload random``: 512 random prompt tokens, no reuse; ``shared``: one of 8 fixed 768-token prefixes, the
same on every server, then 96 random tokens, so the prefix cache serves most of the prompt; 16 output tokens) to
each server in turn, the order reversed every other round, and times each block. Because the servers alternate
every few seconds, the machine's drift (larger here than most effects) hits them alike; the result is, per
variant, the median over rounds of its block time divided by upstream's in the same round (the paired ratio), with
the range. A variant's share is its ratio's distance from the variant with that part off.

Beside the wall time, each block's CPU time is read from every process of the server (``psutil``: user + system
seconds of the HTTP process, the scheduler, the detokenizer) and printed per request and process with the same
paired ratio: the work a part adds, less exposed to the machine's drift than the wall time (an idle server's
processes sleep, so a block's CPU is its own; the scheduler's includes its torch threads' spinning, so it follows
its busy time more than its work).

Variants (``--variants``; each the sglang-iso flags it adds): ``iso`` (defaults), ``check-off`` (``--kv-owner-check
off``), ``scrub-off`` (``--kv-scrub off``), ``both-off`` (both), ``no-tenants`` (no tenants file: no gate and no
keys, every request in one open namespace; the tree, scrub and owner check as in ``iso``). ``--concurrency N`` sends
each block from N clients at once (the block is then N times ``--block`` requests); ``--text`` sends the prompts as
text; ``--decode-steps`` starts every server with ``--decode-log-interval 1`` and prints, per variant, the median
time of the decode steps with N running (from each block's log lines, a step after a prefill left out) and its
paired ratio. Progress (rounds, ETA) goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import (
    CPU_ROLES,
    ServerProcess,
    baseline_server_argv,
    free_port,
    iso_server_argv,
)
from sglang_iso_testing.progress import Progress
from sglang_iso_testing.tenants import write_tenants_file

VARIANTS: dict[str, tuple[str, ...]] = {
    "iso": (),
    "check-off": ("--kv-owner-check", "off"),
    "scrub-off": ("--kv-scrub", "off"),
    "both-off": ("--kv-owner-check", "off", "--kv-scrub", "off"),
    "no-tenants": (),
}
KEYLESS = frozenset({"no-tenants"})
"""Variants started without a tenants file (no gate, no tenant keys: one open namespace), sent no key."""
SIZES = ("--max-total-tokens", "65536", "--max-running-requests", "16")
PROMPT_TOKENS, OUTPUT_TOKENS, WARMUP = 512, 16, 5
PREFIXES, PREFIX_TOKENS, QUESTION_TOKENS = 8, 768, 96
"""The ``shared`` workload: as ``bench_serving.py``'s generated-shared-prefix level."""
UPSTREAM = "upstream"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=20, help="requests per client per server per round")
    parser.add_argument("--concurrency", type=int, default=1, help="clients sending each block at once")
    parser.add_argument("--variants", default="iso,check-off,scrub-off,both-off")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workload", choices=("random", "shared"), default="random")
    parser.add_argument(
        "--text", action="store_true", help="send each prompt as text (the served tokenizer's decoding of its ids)"
    )
    parser.add_argument(
        "--decode-steps",
        action="store_true",
        help="servers log every decode step (--decode-log-interval 1); print each variant's decode step time",
    )
    parser.add_argument("--json", type=Path, help="also write the block times and ratios here")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    key = new_api_key()
    with tempfile.TemporaryDirectory(prefix="sglang-iso-parts-") as tmp:
        tenants = write_tenants_file(Path(tmp), {"acme": {"cache": "private"}}, keys={"acme": key}).path
        servers = start_servers(variants, tenants, STEP_LOG if args.decode_steps else ())
        try:
            rng = random.Random(args.seed)
            ids = _random_prompt if args.workload == "random" else _shared_prompt(rng)
            prompt: Callable[[random.Random], list[int] | str] = _as_text(ids) if args.text else ids
            block = args.block * args.concurrency
            times, cpu, steps = run_rounds(servers, key, args.rounds, block, rng, prompt, args.concurrency)
        finally:
            for server in servers.values():
                server.stop()
    summary = summarize(times)
    for name, row in summary.items():
        print(
            f"{name:10s} median {row['median_ms']:6.2f} ms/request  paired ratio {row['ratio']:.3f} "
            f"(rounds {row['ratio_min']:.3f}-{row['ratio_max']:.3f})"
        )
    cpu_summary = {f"{name} {role}": row for role in CPU_ROLES for name, row in summarize(cpu_of(cpu, role)).items()}
    print("CPU per request (ms), by process:")
    for label, row in cpu_summary.items():
        print(
            f"  {label:24s} median {row['median_ms']:6.2f}  paired ratio {row['ratio']:.3f} "
            f"(rounds {row['ratio_min']:.3f}-{row['ratio_max']:.3f})"
        )
    step_summary = summarize(steps) if args.decode_steps and all(steps.values()) else {}
    if step_summary:
        print(f"Decode step with {args.concurrency} running (ms; median of each block's steps):")
        for name, row in step_summary.items():
            print(
                f"  {name:10s} median {row['median_ms']:6.2f}  paired ratio {row['ratio']:.3f} "
                f"(rounds {row['ratio_min']:.3f}-{row['ratio_max']:.3f})"
            )
    if args.json:
        out = {
            "workload": args.workload, "block": args.block, "times_ms": times, "summary": summary,
            "cpu_ms": cpu, "cpu_summary": cpu_summary, "decode_step_ms": steps, "decode_step_summary": step_summary,
        }  # fmt: skip
        args.json.write_text(json.dumps(out, indent=1))


def start_servers(variants: list[str], tenants: Path, extra: tuple[str, ...] = ()) -> dict[str, ServerProcess]:
    """Upstream first, then each variant (all with the SGLang flags ``extra``); all kept running (idle ones
    sleep)."""
    servers: dict[str, ServerProcess] = {}
    try:
        port = free_port()
        servers[UPSTREAM] = ServerProcess(baseline_server_argv(port, tiny_model_path(), *SIZES, *extra), port)
        servers[UPSTREAM].start(timeout_s=300).freeze_gc()
        for name in variants:
            port = free_port()
            tenancy = () if name in KEYLESS else ("--tenants-file", str(tenants))
            argv = iso_server_argv(port, tiny_model_path(), *SIZES, *extra, *tenancy, *VARIANTS[name])
            servers[name] = ServerProcess(argv, port).start(timeout_s=300)
            if name in KEYLESS:
                servers[name].freeze_gc()  # NOTE: without a tenants file no gate makes the call
            print(f"started {name}", flush=True)
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def run_rounds(
    servers: dict[str, ServerProcess],
    key: str,
    rounds: int,
    block: int,
    rng: random.Random,
    prompt: Callable[[random.Random], list[int] | str],
    concurrency: int = 1,
) -> tuple[dict[str, list[float]], dict[str, list[dict[str, float]]], dict[str, list[float]]]:
    """Per server, the mean time of one request in each round's block (ms: the block's time over its requests),
    its processes' CPU per request in each block (ms, by ``CPU_ROLES``), and the median decode step with
    ``concurrency`` running in each block (ms, from its log; none unless it logs every decode step). ``concurrency``
    clients share a block."""
    names = list(servers)
    keys = {name: None if name == UPSTREAM or name in KEYLESS else key for name in names}
    for name in names:
        for _ in range(WARMUP):
            _request(servers[name], keys[name], prompt(rng))
    pool = ThreadPoolExecutor(max_workers=concurrency)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    steps: dict[str, list[float]] = {name: [] for name in names}
    progress = Progress("parts", rounds, unit="rounds", every_s=0)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            before, seen = servers[name].cpu_seconds(), len(servers[name].log_text())
            started = time.perf_counter()
            prompts = [prompt(rng) for _ in range(block)]
            list(pool.map(lambda p, server=servers[name], k=keys[name]: _request(server, k, p), prompts))
            times[name].append((time.perf_counter() - started) / block * 1000)
            after = servers[name].cpu_seconds()
            cpu[name].append({role: (after[role] - before.get(role, 0.0)) / block * 1000 for role in after})
            step = decode_steps_ms(servers[name].log_text()[seen:], concurrency)
            if step:
                steps[name].append(statistics.median(step))
        progress.step(note=" ".join(f"{n} {times[n][-1]:.1f}" for n in names))
    pool.shutdown()
    return times, cpu, steps


STEP_LOG = ("--decode-log-interval", "1")
"""SGLang logs every decode step: its ``gen throughput`` is then the step's tokens over the step's time."""
_BATCH_LINE = re.compile(r"(Prefill|Decode) batch(?: \[\d+\])?, ")
_DECODE_STATS = re.compile(r"#running-req: (\d+),.*gen throughput \(token/s\): ([\d.]+)")


def decode_steps_ms(log: str, running: int) -> list[float]:
    """Times (ms) of the decode steps with ``running`` requests that followed a decode step (a step after a
    prefill also holds the prefill), from log lines written with :data:`STEP_LOG`."""
    out, previous = [], None
    for line in log.splitlines():
        batch = _BATCH_LINE.search(line)
        if batch is None:
            continue
        stats = _DECODE_STATS.search(line) if batch.group(1) == "Decode" else None
        if stats is not None and previous == "Decode" and int(stats.group(1)) == running:
            tokens_per_s = float(stats.group(2))
            if tokens_per_s > 0:
                out.append(1000.0 * running / tokens_per_s)
        previous = batch.group(1)
    return out


def cpu_of(cpu: dict[str, list[dict[str, float]]], role: str) -> dict[str, list[float]]:
    """One role's CPU per request in each round, per server (the shape :func:`summarize` takes)."""
    return {name: [block[role] for block in blocks] for name, blocks in cpu.items()}


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per server: median block time, and the median and range of its ratio to upstream's in the same round."""
    base = times[UPSTREAM]
    out = {}
    for name, values in times.items():
        ratios = [value / ref for value, ref in zip(values, base, strict=True)]
        out[name] = {
            "median_ms": statistics.median(values),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    return out


def _random_prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(300, 1900) for _ in range(PROMPT_TOKENS)]


def _shared_prompt(seed_rng: random.Random) -> Callable[[random.Random], list[int]]:
    """A prompt maker: one of :data:`PREFIXES` fixed prefixes, then a random question."""
    prefixes = [[seed_rng.randrange(300, 1900) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]

    def prompt(rng: random.Random) -> list[int]:
        return [*rng.choice(prefixes), *(rng.randrange(300, 1900) for _ in range(QUESTION_TOKENS))]

    return prompt


def _as_text(prompt: Callable[[random.Random], list[int]]) -> Callable[[random.Random], str]:
    """A prompt maker sending text: the served model's tokenizer decodes the ids (the server tokenizes them again,
    as it does the text prompts of ``bench_serving.py``'s generated-shared-prefix levels)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    decoded: dict[tuple[int, ...], str] = {}

    def text(rng: random.Random) -> str:
        ids = tuple(prompt(rng))
        if ids not in decoded:
            decoded[ids] = tokenizer.decode(list(ids))
        return decoded[ids]

    return text


def _request(server: ServerProcess, key: str | None, prompt: list[int] | str) -> None:
    """One streamed /generate of ``prompt`` (token ids or text), read to the end."""
    body = {
        "text" if isinstance(prompt, str) else "input_ids": prompt,
        "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "ignore_eos": True},
        "stream": True,
    }
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(server.base_url + "/generate", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


if __name__ == "__main__":
    main()
