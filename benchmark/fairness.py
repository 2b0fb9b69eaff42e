"""Fairness under a flood: tenant B holds many long streams while tenant A sends short requests.

Usage::

    python benchmark/fairness.py [--requests 30] [--running 8] [--flood-factor 4] [--flood-tokens 512]
                                 [--long-streams 40] [--long-tokens 7000]

One sglang-iso server per configuration, one at a time, each with ``--max-total-tokens 65536``:

* ``defaults``: ``--max-running-requests RUNNING``, no per-tenant limit in the tenants file (the request cap is
  half the running slots, the KV share half the pool);
* ``no limits``: the same server, both tenants with a request cap far above the flood and ``kv_share = 1``
  (admission control effectively off; the scheduler's per-tenant interleaving of the waiting queue still applies);
* ``long outputs``: the starvation report's flood: no running-requests flag (SGLang derives it, the request cap is
  32), B opens ``--long-streams`` streams of ``--long-tokens`` tokens each (SGLang reserves KV for their whole
  output), default limits.
* ``rate limits``: the defaults, and B limited to ``--beta-rpm`` requests and ``--beta-tpm`` tokens per minute
  (its refused streams wait the ``Retry-After`` the server sends).

For each, A's time to first token (streamed ``/generate``, 8 new tokens) is measured ``--requests`` times on an
idle server, then again while B keeps its long streams open (``flood-factor x running`` of ``flood-tokens``
tokens for the first two; ``ignore_eos``, re-opened when they end or after a 429's ``Retry-After``). Prints a
table (A's TTFT p50/p99 idle vs flood and their ratio, B's streams served and refused) and writes
``benchmark/fairness.png`` and ``benchmark/fairness.json``.
Goal: with the defaults, A's p99 under flood <= 3x its idle p99.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import key_sha256, new_api_key
from sglang_iso_testing.flood import Flood, pct, short_body, stream
from sglang_iso_testing.process import ServerProcess, free_port, iso_server_argv
from sglang_iso_testing.progress import Progress

HERE = Path(__file__).resolve().parent
CONFIGS = ("defaults", "no limits", "long outputs", "rate limits")


def write_tenants(directory: Path, keys: dict[str, str], limit: int | None, beta_extra: tuple[str, ...] = ()) -> Path:
    (directory / "secret.key").write_bytes(secrets.token_bytes(32))
    lines = ['namespace_secret_file = "secret.key"', ""]
    for tenant in ("alpha", "beta"):
        lines += ["[[tenants]]", f'id = "{tenant}"', f'key_sha256 = ["{key_sha256(keys[tenant])}"]']
        if limit is not None:
            lines += [f"max_concurrent_requests = {limit}", "kv_share = 1"]
        if tenant == "beta":
            lines += list(beta_extra)
        lines.append("")
    path = directory / "tenants.toml"
    path.write_text("\n".join(lines))
    return path


def measure_a(port: int, key: str, n: int, label: str) -> list[float]:
    out: list[float] = []
    progress = Progress(f"  {label}", n, every_s=10)
    for _ in range(n):
        status, ttft, _ = stream(port, key, short_body())
        if status == 200 and ttft is not None:
            out.append(ttft)
        progress.step()
    progress.finish()
    return out


def run_config(config: str, args: argparse.Namespace) -> dict[str, Any]:
    keys = {"alpha": new_api_key(), "beta": new_api_key()}
    with tempfile.TemporaryDirectory(prefix="sglang-iso-fairness-") as tmp:
        limit = None if config in ("defaults", "rate limits") else 100_000
        rates = (f"requests_per_minute = {args.beta_rpm}", f"tokens_per_minute = {args.beta_tpm}")
        tenants = write_tenants(Path(tmp), keys, limit, rates if config == "rate limits" else ())
        port = free_port()
        running = () if config == "long outputs" else ("--max-running-requests", str(args.running))
        argv = iso_server_argv(
            port, tiny_model_path(), "--tenants-file", str(tenants), "--max-total-tokens", "65536", *running
        )
        streams, tokens = args.flood_factor * args.running, args.flood_tokens
        if config == "long outputs":
            streams, tokens = args.long_streams, args.long_tokens
        with ServerProcess(argv, port).start(timeout_s=600):
            print(f"[{config}] server up; warm-up", flush=True)
            measure_a(port, keys["alpha"], 3, "warm-up")
            idle = measure_a(port, keys["alpha"], args.requests, f"[{config}] A idle")
            flood = Flood(port, keys["beta"], streams, tokens)
            time.sleep(args.flood_ramp_s)
            try:
                loaded = measure_a(port, keys["alpha"], args.requests, f"[{config}] A under flood")
            finally:
                flood.close(timeout_s=120)
    return {
        "config": config,
        "idle_p50_ms": 1000 * pct(idle, 0.5),
        "idle_p99_ms": 1000 * pct(idle, 0.99),
        "flood_p50_ms": 1000 * pct(loaded, 0.5),
        "flood_p99_ms": 1000 * pct(loaded, 0.99),
        "p99_ratio": pct(loaded, 0.99) / pct(idle, 0.99),
        "a_served": len(loaded),
        "b_streams_served": flood.served,
        "b_refused": flood.refused,
        "idle": idle,
        "flood": loaded,
        "load_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=30, help="A's requests per phase")
    parser.add_argument("--running", type=int, default=8, help="--max-running-requests of the server")
    parser.add_argument("--flood-factor", type=int, default=4, help="B's streams = factor x running slots")
    parser.add_argument("--flood-tokens", type=int, default=512, help="tokens per B stream")
    parser.add_argument("--long-streams", type=int, default=40, help="B's streams in the long-outputs row")
    parser.add_argument("--long-tokens", type=int, default=7000, help="tokens per B stream in the long-outputs row")
    parser.add_argument("--beta-rpm", type=int, default=60, help="B's requests_per_minute in the rate-limits row")
    parser.add_argument("--beta-tpm", type=int, default=50_000, help="B's tokens_per_minute in the rate-limits row")
    parser.add_argument("--flood-ramp-s", type=float, default=5.0, help="seconds between flood start and A")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ", ".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=HERE / "fairness", help="output path stem (.json, .png)")
    args = parser.parse_args()
    results = [run_config(c, args) for c in args.configs.split(",")]
    header = (
        f"{'config':<12} {'idle p50':>9} {'idle p99':>9} {'flood p50':>10} {'flood p99':>10} {'p99 x':>6} "
        f"{'B served':>9} {'B 429':>6}"
    )
    print(
        f"\nA's TTFT (ms), B flooding with {args.flood_factor * args.running} streams of {args.flood_tokens} tokens"
        f" ({args.long_streams} of {args.long_tokens} in the long-outputs row; B at {args.beta_rpm} requests and"
        f" {args.beta_tpm} tokens per minute in the rate-limits row)"
    )
    print(header)
    for r in results:
        print(
            f"{r['config']:<12} {r['idle_p50_ms']:>9.0f} {r['idle_p99_ms']:>9.0f} {r['flood_p50_ms']:>10.0f} "
            f"{r['flood_p99_ms']:>10.0f} {r['p99_ratio']:>6.2f} {r['b_streams_served']:>9} {r['b_refused']:>6}"
        )
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    data, labels = [], []
    for r in results:
        data += [[1000 * v for v in r["idle"]], [1000 * v for v in r["flood"]]]
        labels += [f"{r['config']}\nidle", f"{r['config']}\nflood"]
    ax.boxplot(data, whis=(0, 99))
    ax.set_xticks(range(1, len(labels) + 1), labels)
    ax.set_ylabel("tenant A TTFT (ms)")
    ax.set_yscale("log")
    ax.set_title("Tenant A's short requests while tenant B floods (whiskers: p0-p99)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
