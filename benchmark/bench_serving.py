"""Tail latency with SGLang's own client: ``python -m sglang.bench_serving`` against upstream and sglang-iso.

Usage::

    python benchmark/bench_serving.py [--rounds 3] [--levels gsp:1,gsp:8,gsp:32,random:8,gsp:8x8,...]

Each level is ``DATASET:CONCURRENCY`` or ``DATASET:CONCURRENCYxTENANTS``:

* ``gsp``: ``--dataset-name generated-shared-prefix`` (8 groups, 768-token system prompts, 96-token questions,
  16 output tokens): shared prefixes, where the prefix cache matters;
* ``random``: ``--dataset-name random-ids`` (512 input, 16 output tokens; no dataset download): no reuse.
* ``xTENANTS``: the load spread over that many tenants' keys: each shared prefix (each generated-shared-prefix
  group; each prompt of ``random-ids``) goes to the next tenant, so every tenant has its own prefixes and upstream,
  keyless, has no cross-tenant reuse that sglang-iso would refuse.

The client is ``sglang.bench_serving`` in one process (so the concurrency is exact), always started through this
file with its bearer-token lookup (``get_auth_headers``, which reads ``OPENAI_API_KEY``) answering per request from
the level's keys: one for a single-tenant level, one per tenant, none for upstream. Both servers so face the same
client code at every level.

Only one server works at a time, both with the same sizes. ``--schedule paired`` (the default): a round starts both
servers (each with ``--sleep-on-idle``, so the idle one waits on its sockets instead of busy-polling), then runs
each level on one server and right after on the other, the first alternating per level and per round, so the two
runs of a level are seconds apart, not a whole round (4-5 minutes of levels per server): this machine drifts by
more than most effects within minutes. ``--schedule sequential``: a round starts one server, runs every level,
stops it, then does the same for the other, the order alternating between rounds. sglang-iso runs with a tenants
file: one tenant for the single-tenant levels and 8 for the others, each with room for the whole load
(``max_concurrent_requests`` 64, ``kv_share`` 1: with the defaults, half the running slots each, a random burst of
32 puts some tenant over its limit and it gets 429, which measures the policy, not the overhead); scrub and owner
check at their defaults.
``--repeats K`` runs each level K times per round on each server (each run its own pair, the first server
alternating), for more pairs per server start. Every run gets its own seed, so no run reuses another's prefixes
(which upstream, keyless, would share across tenants). A warm-up level runs first on each server. Per level and
server the runs' numbers are pooled:
request throughput (median of rounds), TTFT median and P99 (over all requests of all rounds), mean ITL, and the
share of prompt tokens the prefix cache supplied (from SGLang's prefill-batch log lines, so both servers are seen
to reuse the same), and the CPU time per request of the HTTP process and the scheduler (``psutil``, the whole
level; the scheduler's includes its torch threads' spinning, so it follows its busy time); the table prints
iso/upstream ratios and the spread of the runs, and the median of the runs' paired throughput ratios (each run
against its pair, seconds apart: what the machine's drift disturbs least). With ``--repeats`` it also prints each
round's median pair ratio: the pairs of one round share the two server starts, and a server's speed differs between
starts (Steps 17-19 in ``benchmark/README.md``), so a round, not a pair, is the independent sample; prefer rounds to
repeats. Per level, and over all levels (each round's geometric mean over its levels), it prints the geometric mean
of the per-start throughput and P99 TTFT ratios with a 95 % interval (Student's t on their logarithms, one sample per
round): the range a goal such as "throughput at or above 0.98 of upstream" is read against. ``--plot`` writes the TTFT
distributions side by side. Progress (per level, with an ETA per server) goes to stdout.

``--phases`` loads the test plugin :mod:`sglang_iso_testing.phase_timer` into both servers (the comparison server
loads it too) and adds, per level, the milliseconds per scheduler step of each of the scheduler's phases (request
intake, batch selection, the forward with and without what runs before it, result processing, the tree's
operations, and sglang-iso's owner check, with its parts on the host route, and scrub), read from
``/get_server_info`` before and after each run: the share of each part measured where it runs, without sampling;
also per forward mode (``<phase>/extend``, ``<phase>/decode``) and the exact step counts (``steps`` in the JSON; the
table's ``scheduler steps`` rows), where the log-line count of :class:`Batches` is off by up to 40 decode steps;
each phase twice, by wall time and (``<phase>@cpu``) by the scheduler thread's own CPU time, which leaves out the
time the thread waited for a core.

``--interleave``: the pairs are blocks of requests, one per server, seconds or less apart.
Each level run is one client process whose blocks of ``--block`` requests (default: 1 at concurrency 1, 6 per client
above) alternate between the two servers in ABBA order (``slot_of``), a block sent only once the other server has
nothing in flight (so only one server works at a time, at the level's concurrency within a block), at least the
level's prompts per server, in whole blocks, two warm-up requests (one each) left out. Each server's numbers are
sglang.bench_serving's own per-request timings of its requests (TTFT, inter-token gaps, end-to-end latency); its
throughput is its requests over the summed wall time of its blocks (at concurrency 1: 1 / its mean end-to-end
latency, the rate of a client sending to it alone). This machine's speed drifts by tens of per cent within seconds (a
level run on one server, then on the other, reads 5-11 req/s on either); alternating block by block puts both
servers under the same drift, leaving what differs between server starts. A block ends with its last requests
running alone, so above concurrency 1 both servers are measured with the same ramps at each block's end and start.
A many-tenant level gives each shared prefix its tenant in order of first use (:func:`tenant_key`), the same on both
servers: sglang-iso gets that tenant's key, upstream none.

``--control`` starts plain upstream in both slots (the ``iso`` column is then a second upstream, started, warmed up,
frozen and sent requests as the first): an A/A run, whose per-start ratios show the harness's own bias and spread at
each level, with nothing of sglang-iso's.

``--profile DIR`` samples every process of each server (the HTTP process, the scheduler, the detokenizer) with
``py-spy record`` (one per process) while each level runs, writes the collapsed stacks to
``DIR/<server>-<level>-<pid>-<process>.txt`` and prints, per process, the share of samples in each of sglang-iso's
modules (inclusive: the outermost sglang-iso frame of a stack, launchers left out; self: the innermost frame is
ours) and in the model forward, of the samples where a thread was active; the sampler costs both servers the same
(``--profile-rate``, 50 per second by default).

``--pool A.json B.json ...`` runs nothing: it reads earlier runs' ``--json`` files (runs of the same code) and prints
per level the intervals of iso/upstream per server start of throughput, P99 TTFT and the CPU per request of the HTTP
process and the scheduler, every file's starts pooled: more starts than one run holds, for an effect smaller than a
start's spread.

``--logs DIR`` keeps, per server, round and level, the server's log lines (``<server>-round<N>-<level>.log``) and
the client's per-request numbers (``.jsonl``: TTFTs, inter-token gaps): the prefill batches of a round show how the
scheduler split the load (the shared-prefix levels at concurrency 32 settle either in lock-step, every batch of 16
admitted together, or staggered, with about twice the prefill batches, on both servers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing import phase_timer
from sglang_iso_testing.process import (
    CPU_ROLES,
    ServerProcess,
    baseline_server_argv,
    free_port,
    iso_server_argv,
)
from sglang_iso_testing.tenants import write_tenants_file

SIZES = ("--max-total-tokens", "65536", "--max-running-requests", "16")
"""Same KV pool and batch limits for both servers (those of the measurement in the tail-latency issue)."""
SERVERS = ("upstream", "iso")
TENANTS = 8
KEYS_ENV = "SGLANG_ISO_BENCH_KEYS"
"""The tenant keys of a many-tenant level, for the client process (comma-separated)."""
ROUTE_ENV = "SGLANG_ISO_BENCH_ROUTE"
"""``--interleave``: the client process's route, JSON ``{"slots": [[base URL, [key, ...]], ...], "block": requests
per block, "out": path}``: measured block b goes to slot :func:`slot_of` (b), once no
earlier block has a request in flight, with the slot's key of the request's tenant (:func:`tenant_key`; no key for
an empty list); each request's numbers are written to ``out``."""
ROUTE_FILE = "route.jsonl"
"""``--interleave``: the client's per-request numbers, in the run's work directory."""
INTERLEAVE_WARMUPS = 2
"""``--interleave``: sglang.bench_serving's warm-up requests (one per server, by :func:`slot_of`), not counted."""
DEFAULT_LEVELS = "gsp:1,gsp:8,gsp:32,random:8,gsp:8x8,gsp:32x8"
PROMPTS_PER_CLIENT = 20
"""Requests per client and level: 160 at concurrency 8 (as in the tail-latency measurement), at least 48."""
MAX_PROMPTS = 320
"""At most this many per level and round (10 per client at concurrency 32)."""
DATASET_FLAGS = {
    "gsp": (
        "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "8", "--gsp-system-prompt-len", "768",
        "--gsp-question-len", "96", "--gsp-output-len", "16",
    ),
    "random": (
        "--dataset-name", "random-ids", "--random-input-len", "512", "--random-output-len", "16",
        "--random-range-ratio", "1.0",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Level:
    dataset: str
    concurrency: int
    tenants: int

    @property
    def name(self) -> str:
        return f"{self.dataset} c={self.concurrency}" + (f" x{self.tenants} tenants" if self.tenants > 1 else "")

    @property
    def prompts(self) -> int:
        return max(48, min(PROMPTS_PER_CLIENT * self.concurrency, MAX_PROMPTS))


@dataclass
class Samples:
    """One server's results at one level, over all rounds."""

    throughput: list[float] = field(default_factory=list)
    """Request throughput of each round (req/s; the sum over the level's client processes)."""
    ttfts: list[float] = field(default_factory=list)
    """Every request's time to first token (s)."""
    itls: list[float] = field(default_factory=list)
    """Every inter-token latency (s)."""
    p99s: list[float] = field(default_factory=list)
    """P99 TTFT of each round (s), for the spread."""
    hit_pct: list[float] = field(default_factory=list)
    """Share of prompt tokens the prefix cache supplied in each round (from SGLang's prefill-batch log lines)."""
    batches: list[Batches] = field(default_factory=list)
    """How the scheduler batched each round."""
    cpu_ms: list[dict[str, float]] = field(default_factory=list)
    """CPU milliseconds per request of each round, by process (``CPU_ROLES``)."""
    phases: list[dict[str, float]] = field(default_factory=list)
    """With ``--phases``: milliseconds per scheduler step of each phase, each round."""
    steps: list[dict[str, int]] = field(default_factory=list)
    """With ``--phases``: the scheduler's steps of each round, all and per forward mode (:func:`step_counts`)."""


ROUND_SEEDS = 100_000
"""Seed stride between rounds: each level run of a round gets its own seed below it (and the warm-up the last)."""


def level_seed(round_seed: int, level: int, repeat: int, levels: int) -> int:
    """The client seed of one run (level index, repeat): unique within the round, so no run reuses another's
    prefixes (which upstream, keyless, would share across tenants)."""
    return round_seed + 10 * (level + levels * repeat)


def parse_levels(text: str) -> list[Level]:
    levels = []
    for item in filter(None, text.split(",")):
        dataset, _, rest = item.partition(":")
        conc, _, tenants = rest.partition("x")
        if dataset not in DATASET_FLAGS or not conc.isdigit() or (tenants and not tenants.isdigit()):
            raise ValueError(f"level {item!r}: DATASET:CONCURRENCY[xTENANTS], DATASET one of {sorted(DATASET_FLAGS)}")
        level = Level(dataset, int(conc), int(tenants or 1))
        if level.concurrency < level.tenants:
            raise ValueError(f"level {item!r}: concurrency below the number of tenants")
        levels.append(level)
    return levels


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def slot_of(k: int) -> int:
    """``--interleave``: the server (0 or 1) of the client's k-th block (of requests): ABBA order (0, 1, 1, 0, ...),
    so each server runs as often right after itself as right after the other, and each pair of consecutive blocks,
    one per server, is a pair of the same moment's machine."""
    return (k + k // 2) % 2


def block_of(k: int, size: int) -> int:
    """``--interleave``: the block of the client's k-th request, -1 for a warm-up (:data:`INTERLEAVE_WARMUPS`, each
    its own: request k goes to slot ``slot_of(k)``)."""
    return -1 if k < INTERLEAVE_WARMUPS else (k - INTERLEAVE_WARMUPS) // size


def tenant_key(keys: list[str], tenant: int) -> str:
    """``--interleave``: the key a slot sends for the client's ``tenant``-th shared prefix (in order of first use):
    the tenants' keys in turn, as :data:`KEYS_ENV` assigns them; "" (no key) for a keyless slot."""
    return keys[tenant % len(keys)] if keys else ""


def block_size(block: int, concurrency: int) -> int:
    """``--block`` as given, or by default one request at concurrency 1 and 6 per client above."""
    return block if block > 0 else 1 if concurrency == 1 else 6 * concurrency


@dataclass(frozen=True)
class Served:
    """``--interleave``: one server's measured requests of one client run."""

    rate: float
    """Its requests over the summed wall time of its blocks (first send to last answer; req/s): at concurrency 1,
    1 / the mean end-to-end latency, the rate of a client sending one request after another to it alone."""
    ttfts: list[float]
    itls: list[float]
    latencies: list[float]


def split_route(lines: list[str], slots: int = 2) -> list[Served]:
    """Each slot's measured requests from the client's route file (warm-ups dropped; a failed request is refused:
    the two servers' numbers would no longer be of the same prompts' count)."""
    by_slot: list[list[dict[str, Any]]] = [[] for _ in range(slots)]
    for line in lines:
        row = json.loads(line)
        if row["k"] < INTERLEAVE_WARMUPS:
            continue
        if not row["success"]:
            raise RuntimeError(f"request {row['k']} to slot {row['slot']} failed: {row.get('error', '')[:300]}")
        by_slot[row["slot"]].append(row)
    out = []
    for slot, rows in enumerate(by_slot):
        if not rows:
            raise RuntimeError(f"slot {slot} served no measured request")
        latencies = [r["latency"] for r in rows]
        spans: dict[int, tuple[float, float]] = {}
        for r in rows:
            start, end = spans.get(r["block"], (r["start"], r["start"] + r["latency"]))
            spans[r["block"]] = (min(start, r["start"]), max(end, r["start"] + r["latency"]))
        out.append(
            Served(
                rate=len(rows) / sum(end - start for start, end in spans.values()),
                ttfts=[r["ttft"] for r in rows],
                itls=[x for r in rows for x in r["itl"]],
                latencies=latencies,
            )
        )
    return out


@dataclass(frozen=True)
class TenantsFile:
    """The tenants file sglang-iso runs with, and its keys."""

    path: Path
    solo: str
    """The single-tenant levels' key."""
    many: list[str]
    """The many-tenant levels' keys."""
    admin: str
    """Reads ``/get_server_info`` (``--phases``)."""


def write_tenants(directory: Path) -> TenantsFile:
    """A tenants file with one big tenant and :data:`TENANTS` others, all with room for the whole load; their keys."""
    roomy = {"max_concurrent_requests": 64, "kv_share": 1.0}
    ids = ["solo", *(f"tenant{i}" for i in range(TENANTS))]
    made = write_tenants_file(directory, {tenant: roomy for tenant in ids}, keys={t: new_api_key() for t in ids})
    return TenantsFile(made.path, made.keys["solo"], [made.keys[t] for t in ids[1:]], made.keys["admin"])


class Profiler:
    """``py-spy record`` of each process of a server (the HTTP process and its children) for one level."""

    def __init__(self, pid: int, out: Path, rate: int = 50) -> None:
        import psutil

        self.out = out
        main = psutil.Process(pid)
        self.procs: list[tuple[Path, subprocess.Popen[str]]] = []
        for proc in (main, *main.children(recursive=True)):
            name = re.sub(r"\W+", "-", proc.name()).strip("-") or "process"
            path = out.with_name(f"{out.stem}-{proc.pid}-{name}.txt")
            argv = ["py-spy", "record", "--pid", str(proc.pid), "--nonblocking", "--rate", str(rate), "--format", "raw",
                    "--output", str(path)]  # fmt: skip
            self.procs.append(
                (path, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            )

    def stop(self) -> str:
        """Stop sampling; the per-process share table."""
        lines, collapsed = [], []
        for path, proc in self.procs:
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if not path.exists():
                lines.append(f"    {path.name}: py-spy wrote nothing ({err.strip()[-200:]})")
                continue
            label = path.stem.removeprefix(self.out.stem + "-")
            collapsed += [f"process {label};{line}" for line in path.read_text().splitlines()]
        return "\n".join([profile_shares("\n".join(collapsed)), *lines])


ENTRY_FRAMES = re.compile(r"sglang_iso/(launch_server|baseline_server|cli|integration/server)\.py")
"""Our frames under which a whole process runs (the launchers), left out when a stack is attributed."""
IDLE_FRAMES = ("wait", "recv_pyobj", "select", "poll", "sleep")
"""Names ending the innermost function of a waiting thread (py-spy already leaves out most idle threads)."""


def _module(frame: str) -> str:
    found = re.search(r"\((?:.*/)?(sglang_iso(?:_kernels)?/[\w/]+)\.py", frame)
    return found.group(1) if found else "sglang_iso (other)"


def profile_shares(collapsed: str) -> str:
    """Per process: active samples, the model forward's share, and each sglang-iso module's share: ``incl.``
    with what it calls (the gate wraps SGLang's whole app), ``self`` in its own Python frames (torch ops it
    calls included)."""
    per: dict[str, dict[str, int]] = {}
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        # NOTE: the first frame names the process ("process LABEL"), the frames after it are its stack.
        proc, frames = frames[0].removeprefix("process "), frames[1:]
        if not frames:
            continue
        if frames[-1].split(" (")[0].endswith(IDLE_FRAMES):
            continue
        row = per.setdefault(proc, {})
        n = int(count)
        row["total"] = row.get("total", 0) + n
        if any(f.startswith("ModelRunner.forward (") for f in frames):
            row["model forward"] = row.get("model forward", 0) + n
        ours = next((f for f in frames if "sglang_iso" in f and not ENTRY_FRAMES.search(f)), None)
        if ours is not None:
            module = _module(ours) + " (incl.)"
            row[module] = row.get(module, 0) + n
        if "sglang_iso" in frames[-1] and not ENTRY_FRAMES.search(frames[-1]):
            module = _module(frames[-1]) + " (self)"
            row[module] = row.get(module, 0) + n
    lines = []
    for proc, row in sorted(per.items(), key=lambda kv: -kv[1]["total"]):
        total = row.pop("total")
        parts = ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in sorted(row.items(), key=lambda kv: -kv[1]))
        lines.append(f"    {proc}: {total} samples; {parts}")
    return "\n".join(lines)


def run_level(url: str, level: Level, keys: list[str | None], seed: int, workdir: Path) -> tuple[float, list, list]:
    """One level against one server through ``sglang.bench_serving``; (req/s, TTFTs, ITLs)."""
    result = _bench(url, level, keys, seed, workdir)
    itls = [x for row in result["itls"] for x in row]
    return result["request_throughput"], [t for t in result["ttfts"] if t > 0], itls


def run_interleaved(
    slots: list[tuple[str, list[str]]], level: Level, seed: int, workdir: Path, block: int = 1
) -> list[Served]:
    """``--interleave``: one client run of ``level`` whose blocks of ``block`` requests alternate between the two
    servers ``slots`` (base URL, its keys: one per tenant, none for upstream) in :func:`slot_of` order, a block
    starting once the one before has finished, at least ``level.prompts`` measured requests each (whole blocks, as
    many per server); each server's numbers (sglang.bench_serving's own per-request timings, recorded as its request
    function returns them)."""
    route = workdir / ROUTE_FILE
    route.unlink(missing_ok=True)
    spec = {"slots": [[url, list(keys)] for url, keys in slots], "block": block, "out": str(route)}
    blocks = 2 * math.ceil(level.prompts / block)
    blocks += blocks % 4 and 4 - blocks % 4  # (ABBA: whole groups of four)
    _bench(
        slots[0][0], level, [], seed, workdir, prompts=blocks * block, route=spec,
        extra=("--warmup-requests", str(INTERLEAVE_WARMUPS)),
    )  # fmt: skip
    return split_route(route.read_text().splitlines(), len(slots))


def _bench(
    url: str,
    level: Level,
    keys: list[str | None],
    seed: int,
    workdir: Path,
    *,
    prompts: int | None = None,
    route: dict[str, Any] | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run the client process once; sglang.bench_serving's result line."""
    model = str(tiny_model_path())
    out = workdir / f"{level.dataset}-{level.concurrency}-{level.tenants}.jsonl"
    out.unlink(missing_ok=True)
    count = level.prompts if prompts is None else prompts
    bench = [
        "--backend", "sglang", "--base-url", url, *DATASET_FLAGS[level.dataset], "--num-prompts", str(count),
        "--gsp-prompts-per-group", str(max(1, count // 8)), "--max-concurrency", str(level.concurrency),
        "--tokenizer", model, "--model", model, "--seed", str(seed), "--output-file", str(out), "--output-details",
        "--disable-tqdm", *extra,
    ]  # fmt: skip
    # NOTE: every level and server runs the same client process (this file's --as-client), keys or none, so
    # both servers always face the same client code.
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", KEYS_ENV, ROUTE_ENV)}
    env[KEYS_ENV] = ",".join(k for k in keys if k is not None)
    if route is not None:
        env[ROUTE_ENV] = json.dumps(route)
    argv = [sys.executable, str(Path(__file__).resolve()), "--as-client", *bench]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"sglang.bench_serving failed ({level.name}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    failed = len(result["ttfts"]) - result["completed"]
    if result["completed"] == 0 or failed:
        print(f"  {level.name}: {failed} of {len(result['ttfts'])} requests failed", flush=True)
    if result["completed"] == 0:
        raise RuntimeError(f"{level.name}: no request completed")
    return result


def client_main(bench_argv: list[str]) -> None:
    """``sglang.bench_serving`` with one bearer key per shared prefix, from :data:`KEYS_ENV` (see module doc)."""
    import asyncio
    import contextvars
    import itertools

    import sglang.benchmark.serving as client

    keys = [k for k in os.environ.get(KEYS_ENV, "").split(",") if k]
    route = json.loads(os.environ[ROUTE_ENV]) if os.environ.get(ROUTE_ENV) else None
    calls = itertools.count()
    entered: dict[int, int] = {}  # --interleave: requests of each block begun and not finished
    tenant_of: dict[str, int] = {}  # --interleave: each shared prefix's tenant, in order of first use
    rows: list[str] = []  # --interleave: each request's numbers, for the route file
    turns = asyncio.Condition()
    next_key = itertools.cycle(keys)
    owner: dict[str, str] = {}
    current: contextvars.ContextVar[str | None] = contextvars.ContextVar("bench_key", default=None)
    request = client.ASYNC_REQUEST_FUNCS["sglang"]
    own_headers = client.get_auth_headers

    def prefix_of(request_func_input: Any) -> str:
        prompt = request_func_input.prompt
        return prompt[:64] if isinstance(prompt, str) else str(prompt)[:64]

    async def keyed(request_func_input: Any, pbar: Any = None) -> Any:
        if route is not None:
            return await routed(request_func_input, pbar)
        prefix = prefix_of(request_func_input)
        if keys:
            current.set(owner.setdefault(prefix, next(next_key)))  # NOTE: each request runs in its own task
        return await request(request_func_input=request_func_input, pbar=pbar)

    async def routed(request_func_input: Any, pbar: Any) -> Any:
        """``--interleave``: request k in block :func:`block_of` (k) to server :func:`slot_of` (block), sent once no
        earlier block has a request in flight, with that server's key of the request's tenant; its own numbers kept
        for the route file."""
        k = next(calls)
        block = block_of(k, int(route["block"]))
        slot = slot_of(k if block < 0 else block)
        entered[block] = entered.get(block, 0) + 1  # NOTE: before any await: every earlier request is counted
        try:
            async with turns:
                await turns.wait_for(lambda: min(entered) == block)
            base, slot_keys = route["slots"][slot]
            tenant = tenant_of.setdefault(prefix_of(request_func_input), len(tenant_of))
            current.set(tenant_key(slot_keys, tenant))  # ("": this request goes without a key)
            path = urllib.parse.urlsplit(request_func_input.api_url).path
            sent = dataclasses.replace(request_func_input, api_url=base + path)
            got = await request(request_func_input=sent, pbar=pbar)
        finally:
            entered[block] -= 1
            if not entered[block]:
                del entered[block]
            async with turns:
                turns.notify_all()
        row = {"k": k, "block": block, "slot": slot, "success": got.success, "start": got.start_time,
               "latency": got.latency, "ttft": got.ttft, "itl": got.itl, "error": got.error}  # fmt: skip
        rows.append(json.dumps(row))  # (written once the run is over: no file work between requests)
        return got

    # NOTE: outside a request (the ready check, the closing /server_info) the key of the server asked: the first
    # key, or with --interleave the first slot's ("": none).
    outside = tenant_key(route["slots"][0][1], 0) if route is not None else (keys[0] if keys else None)

    def headers() -> dict[str, str]:
        key = current.get()
        key = outside if key is None else key
        return {"Authorization": f"Bearer {key}"} if key else own_headers()

    client.ASYNC_REQUEST_FUNCS["sglang"] = keyed
    client.get_auth_headers = headers
    sys.argv = ["sglang.bench_serving", *bench_argv]
    try:
        client.cli_main()
    finally:
        if route is not None:
            Path(route["out"]).write_text("".join(f"{row}\n" for row in rows))


def prefill_tokens(log: str) -> tuple[int, int]:
    """(computed, cached) prompt tokens of the prefill batches SGLang logged."""
    new = sum(int(x) for x in re.findall(r"#new-token: (\d+)", log))
    cached = sum(int(x) for x in re.findall(r"#cached-token: (\d+)", log))
    return new, cached


@dataclass
class Batches:
    """How a server batched one level's work, from its scheduler's log lines (``SGLANG_LOG_FORWARD_ITERS``)."""

    forwards: int
    """Forward passes (prefill and decode) the scheduler ran: the span of the logged forward counters."""
    prefills: int
    """Prefill batches."""
    seqs_per_prefill: float
    """Mean requests per prefill batch."""
    running_in_decode: float
    """Mean running requests of the logged decode batches (one line per ``--decode-log-interval`` steps, 40 by
    default: pass ``--server-args "--decode-log-interval 1"`` for every step)."""
    decode_logged: int
    """Decode batches logged."""

    def line(self) -> str:
        return (
            f"{self.forwards} forwards, {self.prefills} prefill batches of {self.seqs_per_prefill:.1f} requests, "
            f"decode batches of {self.running_in_decode:.1f} ({self.decode_logged} logged)"
        )


def batches(log: str) -> Batches:
    """:class:`Batches` of the log lines ``log`` holds. Two servers that batch one workload alike run as many
    forwards; a difference in the count is a difference in scheduling, not in the speed of a step."""
    iters = [int(x) for x in re.findall(r"(?:Prefill|Decode) batch \[(\d+)\]", log)]
    seqs = [int(x) for x in re.findall(r"Prefill batch[^,]*, #new-seq: (\d+)", log)]
    running = [int(x) for x in re.findall(r"Decode batch[^,]*, #running-req: (\d+)", log)]
    return Batches(
        forwards=max(iters) - min(iters) + 1 if iters else 0,
        prefills=len(seqs),
        seqs_per_prefill=statistics.fmean(seqs) if seqs else float("nan"),
        running_in_decode=statistics.fmean(running) if running else float("nan"),
        decode_logged=len(running),
    )


def step_counts(phases: dict[str, tuple[float, int]]) -> dict[str, int]:
    """The exact forward count of a run from :func:`~sglang_iso_testing.phase_timer.per_step`'s calls of the step
    phase: ``all`` and each forward mode (``extend``, ``decode``, ...). :class:`Batches` counts forwards from the
    log lines, which SGLang writes every ``--decode-log-interval`` decode steps (40), so its count is off by up to
    that at each end of a run."""
    step = phase_timer.STEP
    prefix = step + "/"
    counts = {mode.removeprefix(prefix): calls for mode, (_, calls) in phases.items() if mode.startswith(prefix)}
    if step in phases:
        counts["all"] = phases[step][1]
    return {mode: counts[mode] for mode in sorted(counts) if not mode.endswith(phase_timer.CPU)}


@dataclass(frozen=True)
class _Mark:
    seen: int
    """Characters of the server's log before the run."""
    cpu: dict[str, float]
    phases: dict[str, list[float]]


def run_pair(
    servers: dict[str, BenchServer],
    level: Level,
    seed: int,
    first: str,
    log_prefix: Callable[[str], Path | None],
    block: int = 1,
) -> dict[str, LevelRun]:
    """``--interleave``: one client run whose blocks of ``block`` requests alternate between the two servers
    (``first`` gets the first), each server's :class:`LevelRun` from its own requests."""
    names = [first, *(n for n in servers if n != first)]
    marks = {n: servers[n].mark() for n in names}
    workdir = servers[first].workdir
    served = run_interleaved([servers[n].slot(level) for n in names], level, seed, workdir, block=block)
    route = workdir / ROUTE_FILE
    return {
        n: servers[n].finish(
            marks[n], level, got.rate, got.ttfts, got.itls, log_prefix(n), route, served=len(got.latencies)
        )
        for n, got in zip(names, served, strict=True)
    }


class BenchServer:
    """One server for a round: started with the level's sizes, warmed up, then run level by level."""

    def __init__(
        self,
        name: str,
        tenants: TenantsFile,
        workdir: Path,
        iso_args: tuple[str, ...] = (),
        both_args: tuple[str, ...] = (),
        profile_dir: Path | None = None,
        profile_rate: int = 50,
        phases: bool = False,
        control: bool = False,
    ) -> None:
        self.name, self.solo, self.many, self.workdir = name, tenants.solo, tenants.many, workdir
        self.iso = name == "iso" and not control
        """sglang-iso (with the tenants file and keys), else plain upstream (``--control``: in both slots)."""
        self.profile_dir, self.profile_rate = profile_dir, profile_rate
        self.phases = phases
        self.info_headers = {"Authorization": f"Bearer {tenants.admin}"} if self.iso else {}
        port = free_port()
        if not self.iso:
            argv = baseline_server_argv(port, tiny_model_path(), *SIZES, *both_args)
        else:
            argv = iso_server_argv(
                port, tiny_model_path(), *SIZES, *both_args, "--tenants-file", str(tenants.path), *iso_args
            )
        env = {"SGLANG_LOG_FORWARD_ITERS": "1", **(phase_timer.plugin_env() if phases else {})}
        self.server = ServerProcess(argv, port, env=env)

    def start(self, seed: int) -> BenchServer:
        self.server.start(timeout_s=600)
        try:
            keys = [self.solo if self.iso else None]
            run_level(self.server.base_url, Level("gsp", 8, 1), keys, seed + ROUND_SEEDS - 1, self.workdir)  # warm-up
            if not self.iso:
                self.server.freeze_gc()  # NOTE: sglang-iso's gate froze its processes once it listened
        except BaseException:
            self.server.stop()
            raise
        return self

    def stop(self) -> None:
        self.server.stop()

    def run(self, level: Level, seed: int, log_prefix: Path | None = None) -> LevelRun:
        """One level against this server."""
        keys: list[str | None] = ([self.solo] if level.tenants == 1 else list(self.many)) if self.iso else [None]
        profiler = None
        if self.profile_dir is not None and self.server.proc is not None:
            slug = re.sub(r"[^\w]+", "-", level.name).strip("-")
            profiler = Profiler(self.server.proc.pid, self.profile_dir / f"{self.name}-{slug}.txt", self.profile_rate)
        mark = self.mark()
        try:
            rate, ttfts, itls = run_level(self.server.base_url, level, keys, seed, self.workdir)
        finally:
            if profiler is not None:
                print(f"  profile of {self.name} at {level.name}:\n{profiler.stop()}", flush=True)
        details = self.workdir / f"{level.dataset}-{level.concurrency}-{level.tenants}.jsonl"
        return self.finish(mark, level, rate, ttfts, itls, log_prefix, details)

    def slot(self, level: Level) -> tuple[str, list[str]]:
        """This server in an interleaved run of ``level``: its base URL and the level's keys (none: upstream)."""
        if not self.iso:
            return self.server.base_url, []
        return self.server.base_url, [self.solo] if level.tenants == 1 else list(self.many)

    def mark(self) -> _Mark:
        """Where this server stands before a run (its log, CPU and phase totals)."""
        return _Mark(len(self.server.log_text()), self.server.cpu_seconds(), self.phase_totals())

    def finish(
        self,
        mark: _Mark,
        level: Level,
        rate: float,
        ttfts: list[float],
        itls: list[float],
        log_prefix: Path | None,
        details: Path,
        served: int | None = None,
    ) -> LevelRun:
        """This server's :class:`LevelRun` of a run that began at ``mark`` (``details``: the client's per-request
        numbers, kept with ``--logs``; ``served``: its requests, if not the level's count)."""
        cpu_after = self.server.cpu_seconds()
        phases = phase_timer.per_step(mark.phases, self.phase_totals()) if self.phases else {}
        count = level.prompts if served is None else served
        cpu_ms = {role: 1e3 * (cpu_after[role] - mark.cpu[role]) / count for role in CPU_ROLES}
        log = self.server.log_text()[mark.seen :]
        if log_prefix is not None:
            slug = re.sub(r"[^\w]+", "-", level.name).strip("-")
            Path(f"{log_prefix}-{slug}.log").write_text(log)
            shutil.copyfile(details, f"{log_prefix}-{slug}.jsonl")
        new, cached = prefill_tokens(log)
        hit = 100.0 * cached / (new + cached) if new + cached else float("nan")
        return LevelRun(
            rate, ttfts, itls, hit, batches(log), cpu_ms, {k: ms for k, (ms, _) in phases.items()}, step_counts(phases)
        )

    def phase_totals(self) -> dict[str, list[float]]:
        """The phase timer's totals of the first scheduler (``--phases``; empty without)."""
        if not self.phases:
            return {}
        status, info = self.server.get_with("/get_server_info", self.info_headers)
        if status != 200:
            raise RuntimeError(f"{self.name}: /get_server_info answered {status}: {info}")
        totals: dict[str, list[float]] = info["internal_states"][0][phase_timer.KEY]
        return totals


@dataclass(frozen=True)
class LevelRun:
    """One server's results at one level in one round."""

    rate: float
    """Request throughput (req/s)."""
    ttfts: list[float]
    itls: list[float]
    hit: float
    """Share of prompt tokens the prefix cache supplied (%)."""
    batched: Batches
    cpu_ms: dict[str, float]
    """CPU milliseconds per request by process (``CPU_ROLES``); with ``--profile``, the samplers' cost included."""
    phases: dict[str, float]
    """With ``--phases``: milliseconds per scheduler step (``run_batch``) of each timed phase; else empty."""
    steps: dict[str, int] = field(default_factory=dict)
    """With ``--phases``: :func:`step_counts` of the run; else empty."""


def per_start(paired: list[float], repeats: int) -> list[float]:
    """The median of each round's ``repeats`` consecutive pair ratios (runs are recorded round by round)."""
    if repeats < 1 or len(paired) % repeats:
        raise ValueError(f"{len(paired)} pairs are not whole rounds of {repeats}")
    return [statistics.median(paired[k : k + repeats]) for k in range(0, len(paired), repeats)]


def interval(ratios: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of independent ratios and its ``confidence`` interval (Student's t on their logarithms).

    The samples must be independent: one per server start (:func:`per_start`), not one per pair.
    """
    if len(ratios) < 2 or not all(math.isfinite(x) and x > 0 for x in ratios):
        raise ValueError(f"an interval needs two or more positive finite ratios, got {ratios}")
    from scipy import stats

    logs = [math.log(x) for x in ratios]
    mean = statistics.fmean(logs)
    half = stats.t.ppf(0.5 + confidence / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def start_ratios(up: list[float], iso: list[float], repeats: int) -> list[float]:
    """iso/upstream of each server start: the median of its round's paired ratios."""
    return per_start([i / u for u, i in zip(up, iso, strict=True)], repeats)


def interval_text(ratios: list[float]) -> str:
    if len(ratios) < 2:
        return "-"
    mean, lo, hi = interval(ratios)
    return f"{mean:.3f} ({lo:.3f}-{hi:.3f})"


def start_means(per_level: list[list[float]]) -> list[float]:
    """Each start's geometric mean of its ratios over the levels (``per_level[level][start]``)."""
    return [statistics.geometric_mean(col) for col in zip(*per_level, strict=True)]


def overall_rows(results: dict[str, dict[Level, Samples]], levels: list[Level], repeats: int) -> list[str]:
    """Across levels: each round's geometric mean over its levels' per-start ratios, then their interval."""
    rows = []
    for label, attr in (("req/s", "throughput"), ("P99 TTFT", "p99s")):
        per_level = [
            start_ratios(getattr(results["upstream"][lv], attr), getattr(results["iso"][lv], attr), repeats)
            for lv in levels
        ]
        rounds = start_means(per_level)
        rows.append(
            f"| all levels | {label} iso/upstream per round, geometric mean over levels (95 % interval over "
            f"{len(rounds)} rounds) | | | {interval_text(rounds)} | {', '.join(f'{x:.2f}' for x in rounds)} |"
        )
    return rows


def table(results: dict[str, dict[Level, Samples]], levels: list[Level], repeats: int = 1) -> str:
    rows = [
        "| level | metric | upstream | sglang-iso | iso/upstream | rounds (upstream; iso) |",
        "|---|---|---|---|---|---|",
    ]
    for level in levels:
        up, iso = results["upstream"][level], results["iso"][level]
        metrics = (
            ("req/s (median of rounds)", statistics.median(up.throughput), statistics.median(iso.throughput),
             up.throughput, iso.throughput, 1.0),
            ("TTFT median ms", statistics.median(up.ttfts), statistics.median(iso.ttfts), None, None, 1e3),
            ("TTFT P99 ms", p99(up.ttfts), p99(iso.ttfts), up.p99s, iso.p99s, 1e3),
            ("ITL mean ms", statistics.fmean(up.itls), statistics.fmean(iso.itls), None, None, 1e3),
            ("prompt tokens from cache %", statistics.fmean(up.hit_pct), statistics.fmean(iso.hit_pct), None, None,
             1.0),
            # NOTE: how the scheduler split the load: a round far above the level's usual count ran staggered.
            ("prefill batches (median of rounds)", statistics.median(b.prefills for b in up.batches),
             statistics.median(b.prefills for b in iso.batches), [b.prefills for b in up.batches],
             [b.prefills for b in iso.batches], 1.0),
            *(
                (f"scheduler steps, {mode} (median of rounds)", statistics.median(c.get(mode, 0) for c in up.steps),
                 statistics.median(c.get(mode, 0) for c in iso.steps), [c.get(mode, 0) for c in up.steps],
                 [c.get(mode, 0) for c in iso.steps], 1.0)
                for mode in (("all", "extend", "decode") if up.steps and iso.steps else ())
            ),
            *(
                (f"{role} CPU ms per request (median of rounds)", statistics.median(c[role] for c in up.cpu_ms),
                 statistics.median(c[role] for c in iso.cpu_ms), [c[role] for c in up.cpu_ms],
                 [c[role] for c in iso.cpu_ms], 1.0)
                for role in ("http", "scheduler")
            ),
        )  # fmt: skip
        for label, u, i, u_rounds, i_rounds, scale in metrics:
            spread = ""
            if u_rounds is not None and i_rounds is not None:
                spread = (
                    f"{min(u_rounds) * scale:.0f}-{max(u_rounds) * scale:.0f}; "
                    f"{min(i_rounds) * scale:.0f}-{max(i_rounds) * scale:.0f}"
                )
                if scale == 1.0:
                    spread = f"{min(u_rounds):.1f}-{max(u_rounds):.1f}; {min(i_rounds):.1f}-{max(i_rounds):.1f}"
            rows.append(f"| {level.name} | {label} | {u * scale:.1f} | {i * scale:.1f} | {i / u:.2f} | {spread} |")
        paired = [i / u for u, i in zip(up.throughput, iso.throughput, strict=True)]
        rows.append(
            f"| {level.name} | req/s iso/upstream of each pair (median of {len(paired)}) | | | "
            f"{statistics.median(paired):.2f} | {min(paired):.2f}-{max(paired):.2f} |"
        )
        throughput_starts = per_start(paired, repeats)
        if repeats > 1:
            rows.append(
                f"| {level.name} | req/s iso/upstream per server start (median of each round's pairs) | | | "
                f"{statistics.median(throughput_starts):.2f} | {', '.join(f'{x:.2f}' for x in throughput_starts)} |"
            )
        for label, starts in (("req/s", throughput_starts), ("P99 TTFT", start_ratios(up.p99s, iso.p99s, repeats))):
            rows.append(
                f"| {level.name} | {label} iso/upstream per server start, geometric mean (95 % interval) | | | "
                f"{interval_text(starts)} | {len(starts)} starts |"
            )
        rows += phase_rows(level.name, up.phases, iso.phases)
    if len(levels) > 1:
        rows += overall_rows(results, levels, repeats)
    return "\n".join(rows)


def pooled_table(paths: list[Path]) -> str:
    """The per-start rows of earlier runs' ``--json`` files, their server starts pooled level by level (runs of
    the same code; a file's ``repeats`` per level, 1 where absent, groups its pairs into starts): per level the
    interval of iso/upstream per start of throughput, P99 TTFT and the HTTP process's and scheduler's CPU per
    request, and over the levels every file has, each start's geometric mean.

    Raises:
        ValueError: a file is not such a file, or no level is in every file.
    """
    runs = []
    for path in paths:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not all(isinstance(data.get(s), dict) for s in SERVERS):
            raise ValueError(f"{path}: not a bench_serving.py --json file (no {' and '.join(SERVERS)} levels)")
        runs.append(data)
    levels = [name for name in runs[0]["upstream"] if all(name in r["upstream"] and name in r["iso"] for r in runs)]
    if not levels:
        raise ValueError("no level is in every file")

    def starts(level: str, key: str, role: str | None = None) -> list[float]:
        ratios: list[float] = []
        for run in runs:
            up, iso = run["upstream"][level], run["iso"][level]
            if key not in up or key not in iso:
                return []  # (a file written before this number was kept)
            u, i = (row[key] if role is None else [v[role] for v in row[key]] for row in (up, iso))
            ratios += start_ratios(u, i, int(up.get("repeats", 1)))
        return ratios

    rows = [
        f"{len(paths)} files pooled; iso/upstream per server start, geometric mean (95 % interval)",
        "",
        "| level | starts | req/s | P99 TTFT | HTTP CPU per request | scheduler CPU per request |",
        "|---|---|---|---|---|---|",
    ]
    throughput = {level: starts(level, "throughput") for level in levels}
    p99s = {level: starts(level, "p99s") for level in levels}
    for level in levels:
        cpu = [interval_text(starts(level, "cpu_ms", role)) for role in ("http", "scheduler")]
        rows.append(
            f"| {level} | {len(throughput[level])} | {interval_text(throughput[level])} | "
            f"{interval_text(p99s[level])} | {cpu[0]} | {cpu[1]} |"
        )
    for label, per_level in (("req/s", throughput), ("P99 TTFT", p99s)):
        counts = {len(v) for v in per_level.values()}
        if len(levels) > 1 and len(counts) == 1:
            means = start_means(list(per_level.values()))
            title = f"all levels, {label} (each start's geometric mean)"
            rows.append(f"| {title} | {len(means)} | {interval_text(means)} |")
    return "\n".join(rows)


def phase_rows(level: str, up: list[dict[str, float]], iso: list[dict[str, float]]) -> list[str]:
    """Table rows of the scheduler phases (``--phases``): ms per step, median of rounds; "-" where a server has none
    (sglang-iso's own phases in upstream)."""
    rows = []
    for phase in dict.fromkeys(k for runs in (up, iso) for run in runs for k in run):
        values = [[run[phase] for run in runs if phase in run] for runs in (up, iso)]
        u, i = (statistics.median(v) if v else None for v in values)
        ratio = f"{i / u:.2f}" if u and i is not None else "-"
        shown = [f"{x:.3f}" if x is not None else "-" for x in (u, i)]
        rows.append(f"| {level} | {phase} ms per step (median of rounds) | {shown[0]} | {shown[1]} | {ratio} | |")
    return rows


def plot(path: Path, results: dict[str, dict[Level, Samples]], levels: list[Level]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(levels), figsize=(3.2 * len(levels), 3.6), squeeze=False)
    for ax, level in zip(axes[0], levels, strict=True):
        data = [[1e3 * t for t in results[s][level].ttfts] for s in SERVERS]
        ax.boxplot(data, whis=(1, 99), showfliers=True, flierprops={"markersize": 2})
        ax.set_xticks([1, 2], ["upstream", "iso"])
        ax.set_title(level.name, fontsize=8)
        ax.set_ylabel("TTFT ms (whiskers: P1-P99)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-client"]:
        client_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds per server (order alternates)")
    p.add_argument("--levels", default=DEFAULT_LEVELS, help="comma-separated DATASET:CONCURRENCY[xTENANTS]")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--repeats", type=int, default=1, help="runs of each level per round and server (more pairs per start)"
    )
    p.add_argument(
        "--phases",
        action="store_true",
        help="time the schedulers' phases per step (test plugin sglang_iso_testing.phase_timer in both servers)",
    )
    p.add_argument(
        "--schedule",
        choices=("paired", "sequential"),
        default="paired",
        help="paired: both servers alive, each level run on one then the other; sequential: one server per round",
    )
    p.add_argument("--plot", default="benchmark/bench_serving.png", help="PNG path (needs matplotlib)")
    p.add_argument("--json", default="", help="also write the pooled numbers here")
    p.add_argument(
        "--iso-args", default="", help='extra sglang-iso flags, e.g. "--kv-owner-check off" (to measure a share)'
    )
    p.add_argument(
        "--server-args", default="", help='extra SGLang flags for both servers, e.g. "--decode-log-interval 1"'
    )
    p.add_argument(
        "--control",
        action="store_true",
        help="plain upstream in both slots (an A/A run: the harness's own bias and spread, none of sglang-iso's)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="one client run per level whose blocks of requests alternate between the two servers (ABBA), each "
        "server's numbers from its own requests (see the module doc)",
    )
    p.add_argument(
        "--block",
        type=int,
        default=0,
        help="with --interleave: requests per block (default: 1 at concurrency 1, 6 per client above)",
    )
    p.add_argument("--profile", default="", help="DIR: py-spy each server's processes per level (see the module doc)")
    p.add_argument("--profile-rate", type=int, default=50, help="py-spy samples per second with --profile")
    p.add_argument(
        "--pool",
        nargs="+",
        default=[],
        metavar="JSON",
        help="run nothing: print the per-start table of earlier runs' --json files (the same code), pooled",
    )
    p.add_argument(
        "--logs",
        default="",
        help="DIR: keep each server's log lines and the client's per-request numbers, per round and level",
    )
    args = p.parse_args(argv)
    if args.pool:
        try:
            print(pooled_table([Path(f) for f in args.pool]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            p.error(f"--pool: {exc}")
        return 0
    profile_dir = Path(args.profile) if args.profile else None
    if profile_dir is not None:
        if shutil.which("py-spy") is None:
            p.error("--profile needs py-spy on PATH (pip install py-spy)")
        profile_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(args.logs) if args.logs else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    try:
        levels = parse_levels(args.levels)
    except ValueError as exc:
        p.error(str(exc))
    if args.rounds < 1 or not levels or not 1 <= args.repeats <= 99:
        p.error("--rounds >= 1, --repeats 1-99 and at least one level")
    if args.interleave and (args.schedule != "paired" or profile_dir is not None or args.block < 0):
        p.error("--interleave takes the paired schedule, --block >= 0 and no --profile")
    if args.control:
        print("control run: plain upstream in both slots (the iso column is a second upstream)", flush=True)
    iso_args = tuple(shlex.split(args.iso_args))
    both_args = tuple(shlex.split(args.server_args))
    results: dict[str, dict[Level, Samples]] = {s: {lv: Samples() for lv in levels} for s in SERVERS}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sglang-iso-bench-serving-") as tmp:
        tenants = write_tenants(Path(tmp))
        made = (tenants, Path(tmp), iso_args, both_args, profile_dir, args.profile_rate, args.phases, args.control)
        runs = [(n, level, k) for n, level in enumerate(levels) for k in range(args.repeats)]

        def record(name: str, level: Level, got: LevelRun) -> None:
            s = results[name][level]
            s.cpu_ms.append(got.cpu_ms)
            s.hit_pct.append(got.hit)
            s.batches.append(got.batched)
            s.throughput.append(got.rate)
            s.ttfts += got.ttfts
            s.itls += got.itls
            s.p99s.append(p99(got.ttfts))
            if got.phases:
                s.phases.append(got.phases)
                s.steps.append(got.steps)
            print(
                f"  {name:8s} {level.name:24s} {got.rate:5.1f} req/s  TTFT p50 "
                f"{1e3 * statistics.median(got.ttfts):6.0f} ms  p99 {1e3 * p99(got.ttfts):6.0f} ms  cached "
                f"{got.hit:4.1f}% of prompt tokens\n  {'':33s} {got.batched.line()}; CPU ms/request: "
                + ", ".join(f"{role} {got.cpu_ms[role]:.1f}" for role in CPU_ROLES)
                + ("; steps " + ", ".join(f"{mode} {n}" for mode, n in got.steps.items()) if got.steps else ""),
                flush=True,
            )

        for r in range(args.rounds):
            order = SERVERS if r % 2 == 0 else tuple(reversed(SERVERS))
            eta = (time.monotonic() - start) / r * (args.rounds - r) if r else float("nan")
            print(f"round {r + 1}/{args.rounds} ({args.schedule}, ETA {eta:.0f} s)", flush=True)
            seed = ROUND_SEEDS * (args.seed + r)

            def logs(name: str, k: int, r: int = r) -> Path | None:
                run = f"-run{k + 1}" if args.repeats > 1 else ""
                return log_dir / f"{name}-round{r + 1}{run}" if log_dir is not None else None

            if args.schedule == "sequential":
                for name in order:
                    server = BenchServer(name, *made).start(seed)
                    try:
                        for n, level, k in runs:
                            record(name, level, server.run(level, level_seed(seed, n, k, len(levels)), logs(name, k)))
                    finally:
                        server.stop()
                continue
            servers: dict[str, BenchServer] = {}
            try:
                for name in order:
                    servers[name] = BenchServer(name, *made).start(seed)
                for n, level, k in runs:
                    # NOTE: the first server alternates per level (and repeat) too, so neither always runs right
                    # after a start.
                    turn = order if (n + k) % 2 == 0 else tuple(reversed(order))
                    if args.interleave:
                        size = block_size(args.block, level.concurrency)
                        pair = run_pair(servers, level, level_seed(seed, n, k, len(levels)), turn[0],
                                        lambda name, k=k: logs(name, k), size)  # fmt: skip
                        for name in turn:
                            record(name, level, pair[name])
                        continue
                    for name in turn:
                        got = servers[name].run(level, level_seed(seed, n, k, len(levels)), logs(name, k))
                        record(name, level, got)
            finally:
                for server in servers.values():
                    server.stop()
    print(f"\n{args.rounds} rounds of {args.repeats} run(s) per level and server, {time.monotonic() - start:.0f} s\n")
    print(table(results, levels, args.repeats))
    if args.json:
        pooled = {
            s: {lv.name: {"throughput": v.throughput, "p99s": v.p99s, "ttft_p50": statistics.median(v.ttfts),
                          "ttft_p99": p99(v.ttfts), "itl_mean": statistics.fmean(v.itls), "hit_pct": v.hit_pct,
                          "batches": [vars(b) for b in v.batches], "cpu_ms": v.cpu_ms, "phases": v.phases,
                          "steps": v.steps,
                          "repeats": args.repeats}
                for lv, v in results[s].items()}
            for s in SERVERS
        }  # fmt: skip
        Path(args.json).write_text(json.dumps(pooled, indent=1))
    if args.plot and plot(Path(args.plot), results, levels):
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
