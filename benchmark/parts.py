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
text; ``--temperature T`` sends that sampling temperature (default: none, the server's; ``sglang.bench_serving`` sends
0, greedy); ``--keep-alive`` sends each client's requests to a server on one open connection (as
``sglang.bench_serving``'s client session does; by default each request opens its own); ``--no-stream`` asks for one
response per request instead of a stream of events (the HTTP process then idles while the request decodes);
``--decode-steps`` starts every server with ``--decode-log-interval 1`` and prints, per variant, the median time of the
decode steps with N running (from each block's log lines, a step after a prefill left out) and its paired ratio.
Progress (rounds, ETA) goes to stdout.

``--starts N`` repeats the whole run N times, every server started afresh each time: a server's speed differs between
its starts by more than the pairing removes within one (``bench_serving.py``'s Steps 17-25), so one start measures
its own servers, not the code. Per start it prints each variant's median paired ratio; over the starts, the geometric
mean of those ratios with a 95 % interval (Student's t on their logarithms, one sample per start, as
``bench_serving.py`` reads its per-start ratios) and the throughput it means at concurrency 1 (upstream's time over
the variant's), for the whole request, to its first streamed event and (at concurrency 1) after it (the decode
steps' share); with ``--phases`` (the test plugin :mod:`sglang_iso_testing.phase_timer` in every server, upstream
included) also each start's milliseconds per scheduler step of the phases :data:`PHASES_SHOWN` and, over the starts,
the paired ratio of the step and of the model forward alone.

``--cpu-profile DIR`` loads :mod:`sglang_iso_testing.cpu_profile` into every server and profiles, over the rounds
after the warm-up, the main thread of each one's HTTP process, scheduler and detokenizer by that thread's own CPU time
(time spent preempted not counted); per start and server it prints each process's profiled CPU per request, the part
of it in sglang-iso's own code (its frames and the built-ins they call, not the SGLang functions its hooks wrap) and,
for the sglang-iso variants, its largest frames; the profiles stay in ``DIR/start-*/<server>-<process>.prof`` (read
them with :mod:`pstats`). cProfile's own cost grows with the Python calls made: read a process's totals between
servers, and sglang-iso's share within one.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import math
import random
import re
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench_serving import interval
from sglang_iso import envvars
from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing import cpu_profile, phase_timer
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
PHASES_SHOWN = (
    "run_batch",
    "model_runner._forward_raw",
    "get_next_batch_to_run",
    "process_batch_result",
    "owner_check",
)
"""The phases ``--phases`` prints per start (milliseconds per scheduler step, and each one's ratio to upstream's)."""


@dataclass
class Rounds:
    """One start's measurements, per server (lists hold one value per round)."""

    times: dict[str, list[float]] = field(default_factory=dict)
    """Mean ms per request of each round's block."""
    ttfts: dict[str, list[float]] = field(default_factory=dict)
    """Mean ms to the first streamed event of each round's block (the whole request when not streamed)."""
    cpu: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    """CPU ms per request of each round's block, by process (``CPU_ROLES``)."""
    steps: dict[str, list[float]] = field(default_factory=dict)
    """Median decode-step ms of each round's block (``--decode-steps`` only)."""
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    """Ms per scheduler step of each timed phase over all rounds (``--phases`` only)."""
    profiles: dict[str, dict[str, cpu_profile.Own]] = field(default_factory=dict)
    """Per server and process role, its profile over all rounds (``--cpu-profile`` only; ms over the whole run)."""
    requests: int = 0
    """Requests each server served over the rounds (warm-up not counted)."""

    def after_first(self) -> dict[str, list[float]]:
        """Mean ms per request after its first streamed event, per round (the decode steps' share)."""
        return {n: [t - f for t, f in zip(self.times[n], self.ttfts[n], strict=True)] for n in self.times}


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
    parser.add_argument(
        "--no-stream", action="store_true", help="one response per request (no server-sent events while it decodes)"
    )
    parser.add_argument(
        "--temperature", type=float, help="sampling temperature (default: the server's; sglang.bench_serving sends 0)"
    )
    parser.add_argument(
        "--keep-alive", action="store_true", help="each client keeps one open connection per server (as bench_serving)"
    )
    parser.add_argument(
        "--phases", action="store_true", help="load the phase timer into every server; print its phases per start"
    )
    parser.add_argument(
        "--cpu-profile",
        type=Path,
        metavar="DIR",
        help="profile every server's processes by thread CPU over the rounds; keep the profiles in DIR/start-*/",
    )
    parser.add_argument("--starts", type=int, default=1, help="whole runs, every server started afresh for each")
    parser.add_argument("--json", type=Path, help="also write the block times and ratios here")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    if args.cpu_profile:
        args.cpu_profile.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    ids = _random_prompt if args.workload == "random" else _shared_prompt(rng)
    prompt: Callable[[random.Random], list[int] | str] = _as_text(ids) if args.text else ids
    block = args.block * args.concurrency
    runs: list[Rounds] = []
    for start in range(args.starts):
        runs.append(run_start(variants, args, rng, prompt, block))
        if args.starts > 1 or args.phases:
            print(start_line(start, args.starts, runs[-1]), flush=True)
        if args.cpu_profile:
            print(profile_lines(runs[-1]), flush=True)
    times = {name: [t for run in runs for t in run.times[name]] for name in runs[0].times}
    cpu = {name: [c for run in runs for c in run.cpu[name]] for name in runs[0].cpu}
    steps = {name: [x for run in runs for x in run.steps[name]] for name in runs[0].steps}
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
    starts = {}
    if len(runs) > 1:
        measures = start_measures(runs, stream=not args.no_stream, concurrency=args.concurrency)
        print(f"Over {len(runs)} starts (per start: the median paired ratio; geometric mean, 95 % interval):")
        for label, per_start in measures.items():
            starts[label] = over_starts(per_start)
            for name, (mean, low, high) in starts[label].items():
                print(f"  {label:22s} {name:10s} time ratio {mean:.3f} ({low:.3f}-{high:.3f})", end="")
                print(f"; throughput {1 / mean:.3f} ({1 / high:.3f}-{1 / low:.3f})" if label == "request" else "")
        if args.phases:
            for phase in PHASES_SHOWN[:2]:
                for name in (n for n in runs[0].phases if n != UPSTREAM):
                    ratios = [r.phases[name][phase] / r.phases[UPSTREAM][phase] for r in runs]
                    mean, low, high = interval(ratios)
                    print(f"  {phase:22s} {name:10s} ms per step ratio {mean:.3f} ({low:.3f}-{high:.3f})")
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
            "by_start": [{**vars(run), "profiles": {n: {r: o._asdict() for r, o in p.items()}
                                                    for n, p in run.profiles.items()}} for run in runs],
            "over_starts": starts,
        }  # fmt: skip
        args.json.write_text(json.dumps(out, indent=1))


def run_start(
    variants: list[str],
    args: argparse.Namespace,
    rng: random.Random,
    prompt: Callable[[random.Random], list[int] | str],
    block: int,
) -> Rounds:
    """Start every server, run the rounds (:func:`run_rounds`), stop them."""
    key = new_api_key()
    with tempfile.TemporaryDirectory(prefix="sglang-iso-parts-") as tmp:
        made = write_tenants_file(Path(tmp), {"acme": {"cache": "private"}}, keys={"acme": key})
        profiles = Path(tempfile.mkdtemp(prefix="start-", dir=args.cpu_profile)) if args.cpu_profile else None
        env = plugin_env(args.phases, profiles)
        servers = start_servers(variants, made.path, STEP_LOG if args.decode_steps else (), env)
        admin = {"Authorization": f"Bearer {made.keys['admin']}"}
        totals = {n: (lambda server=s, n=n: phase_totals(server, {} if n == UPSTREAM or n in KEYLESS else admin))
                  for n, s in servers.items()} if args.phases else {}  # fmt: skip
        roles: dict[str, dict[int, str]] = {}

        def toggle_profiles() -> None:
            for name, server in servers.items():
                roles[name] = cpu_profile.toggle_server(server)

        try:
            out = run_rounds(
                servers, key, args.rounds, block, rng, prompt, args.concurrency, not args.no_stream, totals,
                args.temperature, args.keep_alive, toggle_profiles if args.cpu_profile else None,
            )  # fmt: skip
            if profiles is not None:
                out.profiles = {name: cpu_profile.read_server(profiles, pids, name) for name, pids in roles.items()}
            return out
        finally:
            for server in servers.values():
                server.stop()


def plugin_env(phases: bool, profiles: Path | None) -> dict[str, str] | None:
    """The environment loading the phase timer (``phases``) and the CPU profiler (writing to ``profiles``), if any."""
    envs = [phase_timer.plugin_env()] if phases else []
    envs += [cpu_profile.plugin_env(profiles)] if profiles is not None else []
    if not envs:
        return None
    merged = {k: v for env in envs for k, v in env.items()}
    merged[envvars.TEST_PLUGINS.name] = ",".join(env[envvars.TEST_PLUGINS.name] for env in envs)
    return merged


def start_servers(
    variants: list[str], tenants: Path, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> dict[str, ServerProcess]:
    """Upstream first, then each variant (all with the SGLang flags ``extra`` and the environment ``env``); all kept
    running (idle ones sleep)."""
    servers: dict[str, ServerProcess] = {}
    try:
        port = free_port()
        servers[UPSTREAM] = ServerProcess(baseline_server_argv(port, tiny_model_path(), *SIZES, *extra), port, env=env)
        servers[UPSTREAM].start(timeout_s=300).freeze_gc()
        for name in variants:
            port = free_port()
            tenancy = () if name in KEYLESS else ("--tenants-file", str(tenants))
            argv = iso_server_argv(port, tiny_model_path(), *SIZES, *extra, *tenancy, *VARIANTS[name])
            servers[name] = ServerProcess(argv, port, env=env).start(timeout_s=300)
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
    stream: bool = True,
    totals: dict[str, Callable[[], dict[str, list[float]]]] | None = None,
    temperature: float | None = None,
    keep_alive: bool = False,
    measuring: Callable[[], None] | None = None,
) -> Rounds:
    """Per server (:class:`Rounds`): the mean time of one request in each round's block (ms: the block's time over
    its requests) and to its first streamed event, its processes' CPU per request in each block (ms, by
    ``CPU_ROLES``), the median decode step with ``concurrency`` running in each block (ms, from its log; none unless it
    logs every decode step), and with ``totals`` (each server's phase-timer reader) its phases per step over all
    rounds. ``concurrency`` clients share a block; ``measuring`` is called after the warm-up and after the last
    round."""
    names = list(servers)
    keys = {name: None if name == UPSTREAM or name in KEYLESS else key for name in names}
    for name in names:
        for _ in range(WARMUP):
            _request(servers[name], keys[name], prompt(rng), stream, temperature, keep_alive)
    pool = ThreadPoolExecutor(max_workers=concurrency)
    out = Rounds(*({name: [] for name in names} for _ in range(4)))  # type: ignore[arg-type]
    times, ttfts, cpu, steps = out.times, out.ttfts, out.cpu, out.steps
    before_phases = {name: read() for name, read in (totals or {}).items()}
    if measuring is not None:
        measuring()
    progress = Progress("parts", rounds, unit="rounds", every_s=0)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            before, seen = servers[name].cpu_seconds(), len(servers[name].log_text())
            started = time.perf_counter()
            prompts = [prompt(rng) for _ in range(block)]
            send = functools.partial(
                _request, servers[name], keys[name], stream=stream, temperature=temperature, keep_alive=keep_alive
            )
            firsts = list(pool.map(send, prompts))
            times[name].append((time.perf_counter() - started) / block * 1000)
            ttfts[name].append(statistics.fmean(firsts) * 1000)
            after = servers[name].cpu_seconds()
            cpu[name].append({role: (after[role] - before.get(role, 0.0)) / block * 1000 for role in after})
            step = decode_steps_ms(servers[name].log_text()[seen:], concurrency)
            if step:
                steps[name].append(statistics.median(step))
        progress.step(note=" ".join(f"{n} {times[n][-1]:.1f}" for n in names))
    if measuring is not None:
        measuring()
    out.requests = rounds * block
    pool.shutdown()
    for name, read in (totals or {}).items():
        out.phases[name] = {phase: ms for phase, (ms, _) in phase_timer.per_step(before_phases[name], read()).items()}
    return out


def phase_totals(server: ServerProcess, headers: dict[str, str]) -> dict[str, list[float]]:
    """The phase timer's totals in ``server``'s (first) scheduler."""
    status, info = server.get_with("/get_server_info", headers)
    if status != 200:
        raise RuntimeError(f"/get_server_info answered {status}: {str(info)[:200]}")
    totals: dict[str, list[float]] = info["internal_states"][0][phase_timer.KEY]
    return totals


def profile_lines(run: Rounds, top: int = 4) -> str:
    """One start's CPU profiles (``--cpu-profile``): per server and process, the profiled CPU per request and
    sglang-iso's own part of it; in each process of the sglang-iso variants, that part by sglang-iso's parts
    (:data:`~sglang_iso_testing.cpu_profile.PARTS`) and its largest frames."""
    lines = ["CPU profile, ms of thread CPU per request (profiled; sglang-iso's own code in brackets):"]
    per = max(run.requests, 1)
    for name, by_role in run.profiles.items():
        cells = [f"{role} {o.total_ms / per:7.3f} [{o.own_ms / per:6.3f}]" for role, o in sorted(by_role.items())]
        lines.append(f"  {name:10s} " + "  ".join(cells))
        if name == UPSTREAM:
            continue
        for role, o in sorted(by_role.items()):
            if not o.top:
                continue
            shares = ", ".join(f"{part} {ms / per:.3f}" for part, ms in o.parts.items())
            frames = ", ".join(f"{frame.split('/')[-1]} {ms / per:.3f}" for frame, ms in o.top[:top])
            lines.append(f"    {role:11s} by part: {shares}; frames: {frames}")
    return "\n".join(lines)


def start_line(start: int, starts: int, run: Rounds) -> str:
    """One start's median paired ratios (request, first event, phases per step) per variant."""
    rows = []
    for name, row in summarize(run.times).items():
        if name == UPSTREAM:
            continue
        first = summarize(run.ttfts)[name]["ratio"]
        shown = [f"{name} {row['ratio']:.3f} (first event {first:.3f})"]
        for phase in PHASES_SHOWN if run.phases else ():
            up, it = run.phases[UPSTREAM].get(phase, 0.0), run.phases[name].get(phase, 0.0)
            shown.append(f"{phase} {it:.3f}" + (f"/{up:.3f}" if up else ""))
        rows.append(" ".join(shown))
    return f"start {start + 1}/{starts}: " + "; ".join(rows)


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
    """Per server: median block time, and the median and range of its ratio to upstream's in the same round (rounds
    where upstream's value is 0 left out: a block's CPU time can be under the clock's tick; NaN when none is left)."""
    base = times[UPSTREAM]
    out = {}
    for name, values in times.items():
        ratios = [value / ref for value, ref in zip(values, base, strict=True) if ref > 0]
        out[name] = {
            "median_ms": statistics.median(values),
            "ratio": statistics.median(ratios) if ratios else math.nan,
            "ratio_min": min(ratios, default=math.nan),
            "ratio_max": max(ratios, default=math.nan),
        }
    return out


def start_measures(runs: list[Rounds], *, stream: bool, concurrency: int) -> dict[str, list[dict[str, list[float]]]]:
    """What is read over the starts: the whole request and the time to its first event; with a stream at concurrency
    1 also the time after it (above 1 a block's time per request is its wall time over its requests, not one
    request's latency, so no request's time after its first event can be had from it)."""
    measures = {"request": [r.times for r in runs], "to the first event": [r.ttfts for r in runs]}
    if stream and concurrency == 1:
        measures["after the first event"] = [r.after_first() for r in runs]
    return measures


def over_starts(runs: list[dict[str, list[float]]]) -> dict[str, tuple[float, float, float]]:
    """Per variant (upstream left out): the geometric mean of each start's median paired ratio to upstream, with its
    95 % interval (one sample per start; two starts or more)."""
    per_start = [summarize(times) for times in runs]
    names = [name for name in runs[0] if name != UPSTREAM]
    return {name: interval([start[name]["ratio"] for start in per_start]) for name in names}


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


def _request(
    server: ServerProcess,
    key: str | None,
    prompt: list[int] | str,
    stream: bool = True,
    temperature: float | None = None,
    keep_alive: bool = False,
) -> float:
    """One /generate of ``prompt`` (token ids or text), streamed or not, read to the end; the seconds to its first
    streamed event (to the end when not streamed). ``keep_alive``: on this thread's open connection to the server
    (made on first use), as ``sglang.bench_serving``'s client session sends; otherwise on a new connection."""
    body = {
        "text" if isinstance(prompt, str) else "input_ids": prompt,
        "sampling_params": {
            "max_new_tokens": OUTPUT_TOKENS,
            "ignore_eos": True,
            **({} if temperature is None else {"temperature": temperature}),
        },
        "stream": stream,
    }
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if keep_alive:
        return _request_on_open_connection(server, json.dumps(body).encode(), headers)
    request = urllib.request.Request(server.base_url + "/generate", json.dumps(body).encode(), headers)
    sent = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        return _to_first_event(response, sent)


def _to_first_event(lines: Iterable[bytes], sent: float) -> float:
    """Read a response's lines to the end; the seconds from ``sent`` to its first streamed event (to the end when
    it has none)."""
    first = None
    for line in lines:
        if first is None and line.startswith(b"data:"):
            first = time.perf_counter()
    return (first if first is not None else time.perf_counter()) - sent


_OPEN = threading.local()
"""Each client thread's open connections, by server port (``--keep-alive``)."""


def _request_on_open_connection(server: ServerProcess, body: bytes, headers: dict[str, str]) -> float:
    """:func:`_request` on this thread's open connection to ``server``.

    Raises:
        RuntimeError: the server answered other than 200.
    """
    connections: dict[int, http.client.HTTPConnection] = _OPEN.__dict__.setdefault("by_port", {})
    connection = connections.get(server.port)
    if connection is None:
        connection = connections[server.port] = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    sent = time.perf_counter()
    try:
        connection.request("POST", "/generate", body=body, headers=headers)
        response = connection.getresponse()
    except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
        # NOTE: the server closed the connection while it sat idle (uvicorn does after 5 s): once on a new one
        connection.close()
        connection = connections[server.port] = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        sent = time.perf_counter()
        connection.request("POST", "/generate", body=body, headers=headers)
        response = connection.getresponse()
    took = _to_first_event(response, sent)
    response.read()  # NOTE: to the end of the chunked body, so the connection can carry the next request
    if response.status != 200:
        raise RuntimeError(f"/generate answered {response.status}")
    return took


if __name__ == "__main__":
    main()
