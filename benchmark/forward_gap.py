"""What time between two forwards costs the forward after it, in plain upstream's serving scheduler on this machine.

Usage::

    python benchmark/forward_gap.py [--gaps 0,300,1000,300:4096] [--level gsp:8] [--runs 2]

sglang-iso's own work in the scheduler (the owner check, the scrub, the tree's and the fairness hooks' Python) runs
between two forwards. Whether a microsecond there costs a microsecond of throughput, or more, depends on what the
forward after it pays for the wait (a thread pool that went idle, caches the wait let go cold). This measures it
in upstream's server alone, so nothing of sglang-iso's is in its loop: per gap, one comparison server
(``python -m sglang_iso.baseline_server``, the sizes of ``bench_serving.py``) with the test plugin
:mod:`sglang_iso_testing.forward_gap`, which holds the scheduler thread for the gap before every second forward (a
busy loop on the clock; ``US:KB``, writing over a buffer of KB kilobytes meanwhile, as work that takes the caches
from the forward) and times each forward's wall and CPU time by whether a gap came before it. The load is
``sglang.bench_serving`` at ``--level`` (``bench_serving.py``'s levels), ``--runs`` times per server. For decode
forwards it prints the milliseconds per forward after a gap and after none, their difference, and that difference
over the hold's measured length: the share of a wait that the next forward pays again. Prefill forwards are left
out: their sizes differ by an order of magnitude, so two alternating halves of a few dozen do not compare. Gap 0 is
the control: both halves alike, so its difference is the split's own noise. One server runs at a time; progress
goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_serving
from bench_serving import SIZES, parse_levels, run_level
from sglang_iso.models import tiny_model_path
from sglang_iso_testing import forward_gap
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port

MODES = ("decode",)


def parse_gap(text: str) -> tuple[int, int]:
    """``US`` or ``US:KB`` -> (microseconds, kilobytes)."""
    us, _, kb = text.partition(":")
    return int(us), int(kb or 0)


def measure(gap: tuple[int, int], level: bench_serving.Level, runs: int, seed: int, workdir: Path) -> dict[str, Any]:
    """One server holding ``gap`` (microseconds, kilobytes): its forwards' costs per mode over ``runs`` runs of
    ``level``."""
    port = free_port()
    argv = baseline_server_argv(port, tiny_model_path(), *SIZES, "--sleep-on-idle")
    server = ServerProcess(argv, port, env=forward_gap.plugin_env(*gap))
    server.start(timeout_s=600)
    try:
        run_level(server.base_url, bench_serving.Level("gsp", 8, 1), [None], seed - 1, workdir)  # warm-up
        server.freeze_gc()
        before = totals(server)
        rates = [run_level(server.base_url, level, [None], seed + k, workdir)[0] for k in range(runs)]
        after = totals(server)
    finally:
        server.stop()
    costs = {m: forward_gap.cost(before, after, m) for m in MODES}
    return {"gap_us": gap[0], "gap_kb": gap[1], "req_per_s": rates, **costs}


def totals(server: ServerProcess) -> dict[str, list[float]]:
    """The plugin's totals in the server's first scheduler."""
    status, info = server.get_with("/get_server_info", {})
    if status != 200:
        raise RuntimeError(f"/get_server_info answered {status}: {info}")
    reported: dict[str, list[float]] = info["internal_states"][0][forward_gap.KEY]["totals"]
    return reported


def rows(result: dict[str, Any]) -> list[str]:
    """The table rows of one gap's result."""
    out = []
    gap = f"{result['gap_us']}" + (f", {result['gap_kb']} KB" if result.get("gap_kb") else "")
    for mode in MODES:
        c = result.get(mode)
        if c is None:
            continue
        wall = c["gap_wall_ms"] - c["none_wall_ms"]
        cpu = c["gap_cpu_ms"] - c["none_cpu_ms"]
        share = f"{wall / c['hold_ms']:.2f}" if result["gap_us"] > 0 and c["hold_ms"] > 0 else "-"  # (0: the control)
        out.append(
            f"| {gap} | {c['hold_ms'] * 1e3:.0f} | {mode} | {c['none_forwards']:.0f}; {c['gap_forwards']:.0f} | "
            f"{c['none_wall_ms']:.3f} | {c['gap_wall_ms']:.3f} | {wall:+.3f} | {cpu:+.3f} | {share} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--gaps", default="0,300,1000,300:4096", help="comma-separated US or US:KB (kilobytes written), one server each"
    )
    p.add_argument("--level", default="gsp:8", help="one of bench_serving.py's levels")
    p.add_argument("--runs", type=int, default=2, help="runs of the level per server")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="", help="also write the results here")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    gaps = [parse_gap(g) for g in args.gaps.split(",")]
    (level,) = parse_levels(args.level)
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="forward-gap-") as tmp:
        for i, gap in enumerate(gaps):
            left = "" if not i else f", about {(time.monotonic() - started) / i * (len(gaps) - i):.0f} s left"
            print(f"gap {gap[0]} us, {gap[1]} KB ({i + 1}/{len(gaps)}{left})", flush=True)
            results.append(measure(gap, level, args.runs, args.seed + 1000 * i, Path(tmp)))
            print("  " + " ".join(f"{r:.1f}" for r in results[-1]["req_per_s"]) + " req/s", flush=True)
    print(
        "\n| gap us asked | hold us measured | mode | forwards (none; gap) | ms per forward after none | "
        "after the gap | wall difference | CPU difference | wall difference / hold |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    for result in results:
        print("\n".join(rows(result)))
    if args.json:
        Path(args.json).write_text(json.dumps({"level": level.name, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
