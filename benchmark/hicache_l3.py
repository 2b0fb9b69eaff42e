"""L3 encryption at rest on a real server: hits from encrypted vs plaintext page files, side by side in one run.

Usage::

    python benchmark/hicache_l3.py [--prompts 8] [--words 50] [--rounds 3] [--concurrency 4] [--seed 0]

Two configurations of one sglang-iso server (HiCache host tier and L3 ``file`` tier, one tenant), differing by the
L3 cipher alone: ``encrypted`` (AES-256-GCM under the tenant's key, the only production format) and ``plaintext``
(the test plugin :mod:`sglang_iso_testing.l3_plain`: page bytes as they are, authenticated by an HMAC tag of the
same size). Per round, in alternating order, for each configuration: a fresh L3 directory; start, send the
working set (``--prompts`` distinct prompts, then as many fillers, which push everything to the host and the
files), stop; restart on that directory (device and host empty) and send the working set again,
``--concurrency`` at a time, one new token each: every prompt's KV comes back from the files. Reported per
configuration over all rounds: L3-hit latency (median, P99), throughput of the restart phase (requests/s), hit
rate, and the scheduler's time in L3 writes during the fill (the host tier's counters); then the ratios encrypted
/ plaintext. Writes ``benchmark/hicache_l3.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sglang_iso import envvars
from sglang_iso.models import tiny_model_path
from sglang_iso.server.hicache_args import UPSTREAM_DIR_ENV
from sglang_iso.tenancy.keys import key_sha256, new_api_key
from sglang_iso_testing.process import ServerProcess, free_port, iso_server_argv
from sglang_iso_testing.progress import Progress

HERE = Path(__file__).resolve().parent
CONFIGS = ("encrypted", "plaintext")
PLAIN_ENV = {envvars.TESTING.name: "1", envvars.TEST_PLUGINS.name: "sglang_iso_testing.l3_plain"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--words", type=int, default=50, help="about 8 tokens per word with the bundled model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--device-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    key, admin = new_api_key(), new_api_key()
    work = Path(tempfile.mkdtemp(prefix="hicache-l3-bench-"))
    (work / "secret.key").write_bytes(secrets.token_bytes(32))
    (work / "tenants.toml").write_text(
        f'namespace_secret_file = "secret.key"\nadmin_key_sha256 = ["{key_sha256(admin)}"]\n'
        f'[[tenants]]\nid = "solo"\nkey_sha256 = ["{key_sha256(key)}"]\n'
    )
    rng = random.Random(args.seed)
    results: dict[str, dict[str, list[Any]]] = {c: {"rows": [], "wall_s": [], "l3_write_ms": []} for c in CONFIGS}
    progress = Progress("hicache-l3", args.rounds * len(CONFIGS) * 3 * args.prompts, every_s=15)
    try:
        for rnd in range(args.rounds):
            for config in CONFIGS if rnd % 2 == 0 else CONFIGS[::-1]:
                prompts = [prompt(args.words, rng) for _ in range(args.prompts)]
                l3 = work / f"l3-{rnd}-{config}"
                l3.mkdir()
                fill = server(work, l3, config, args.device_tokens)
                try:
                    fill.start()
                    for text in prompts + [prompt(args.words, rng) for _ in range(args.prompts)]:
                        send(fill, key, text)
                        progress.step(note=config)
                    results[config]["l3_write_ms"].append(tier(fill, admin)["l3_write_us"] / 1000)
                finally:
                    fill.stop()
                again = server(work, l3, config, args.device_tokens)
                try:
                    again.start()
                    t0 = time.perf_counter()
                    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
                        rows = list(pool.map(lambda text, srv=again: send(srv, key, text), prompts))
                    results[config]["wall_s"].append(time.perf_counter() - t0)
                    results[config]["rows"] += rows
                    progress.step(len(prompts), note=config)
                finally:
                    again.stop()
                shutil.rmtree(l3, ignore_errors=True)
        progress.finish()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results, args)


def server(work: Path, l3: Path, config: str, device_tokens: int) -> ServerProcess:
    port = free_port()
    argv = iso_server_argv(
        port, tiny_model_path(), "--tenants-file", str(work / "tenants.toml"), "--max-total-tokens",
        str(device_tokens), "--max-running-requests", "8", "--enable-hierarchical-cache",
        "--hicache-storage-backend", "file",
    )  # fmt: skip
    env = {UPSTREAM_DIR_ENV: str(l3), **(PLAIN_ENV if config == "plaintext" else {})}
    return ServerProcess(argv, port, env=env)


def prompt(words: int, rng: random.Random) -> str:
    nonce = uuid.UUID(int=rng.getrandbits(128)).hex
    return f"{nonce} " + " ".join(f"w{i}x{nonce[:4]}" for i in range(words))


def send(srv: ServerProcess, key: str, text: str) -> tuple[int, int, float]:
    """(prompt tokens, cached tokens, seconds) of one request with one new token."""
    t0 = time.perf_counter()
    status, out = srv.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}},
        headers={"Authorization": f"Bearer {key}"},
    )
    elapsed = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {out}")
    meta = out["meta_info"]
    return int(meta["prompt_tokens"]), int(meta.get("cached_tokens", 0)), elapsed


def tier(srv: ServerProcess, admin: str) -> dict[str, Any]:
    status, info = srv.get_with("/get_server_info", {"Authorization": f"Bearer {admin}"})
    if status != 200:
        raise RuntimeError(f"/get_server_info: HTTP {status}: {info}")
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    return {k.removeprefix("tier_"): tree[k] for k in tree if k.startswith("tier_")}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(results: dict[str, dict[str, list[Any]]], args: argparse.Namespace) -> None:
    summary: dict[str, dict[str, float]] = {}
    for config, r in results.items():
        latency = [row[2] * 1000 for row in r["rows"]]
        prompt_tokens = sum(row[0] for row in r["rows"])
        summary[config] = {
            "requests": len(latency),
            "hit_rate": sum(row[1] for row in r["rows"]) / prompt_tokens if prompt_tokens else 0.0,
            "latency_p50_ms": _pct(latency, 0.5),
            "latency_p99_ms": _pct(latency, 0.99),
            "throughput_rps": len(latency) / sum(r["wall_s"]) if r["wall_s"] else 0.0,
            "l3_write_ms_per_round": sum(r["l3_write_ms"]) / max(len(r["l3_write_ms"]), 1),
        }
    print(f"\n{args.rounds} rounds, {args.prompts} prompts of ~{args.words} words, restart phase at concurrency "
          f"{args.concurrency}; L3 hits after a restart")  # fmt: skip
    print(f"{'config':<11}{'hit rate':>9}{'p50 ms':>9}{'P99 ms':>9}{'req/s':>8}{'L3 write ms/round':>19}")
    for config, s in summary.items():
        print(f"{config:<11}{s['hit_rate']:>9.3f}{s['latency_p50_ms']:>9.1f}{s['latency_p99_ms']:>9.1f}"
              f"{s['throughput_rps']:>8.2f}{s['l3_write_ms_per_round']:>19.1f}")  # fmt: skip
    enc, plain = summary["encrypted"], summary["plaintext"]
    ratios = {k: enc[k] / plain[k] if plain[k] else float("nan") for k in enc if k != "requests"}
    print("ratio encrypted / plaintext: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    out = {"args": vars(args), "summary": summary, "ratios": ratios, "raw": results}
    (HERE / "hicache_l3.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
