"""Hierarchical cache: hit rate and TTFT of sglang-iso vs upstream HiCache, working set larger than the device pool.

Usage::

    python benchmark/hicache.py [--prompts 10] [--words 50] [--rounds 3] [--device-tokens 2048] [--seed 0]

Both servers run side by side in one run, with the same device pool (``--max-total-tokens``) and
``--enable-hierarchical-cache`` (host tier 2x the device pool): sglang-iso with a tenants file (one tenant, its
own host tier) and upstream SGLang with its default tree cache and HiCache (global sharing; on CPU with
``--hicache-io-backend direct --hicache-mem-layout layer_first`` and the CPU shims of
``platform/hicache_cpu.py``). Single-tenant traffic: ``--prompts`` distinct prompts of about ``--words`` words
each (together larger than the device pool), sent ``--rounds`` times in a seeded random order, one at a time,
with one new token (the request latency is the time to first token). Round 1 is cold and not counted.

Prints the hit rate (cached / prompt tokens) and mean TTFT per server and their ratios; target: sglang-iso's
hit rate >= 0.95x upstream's. Also prints what sglang-iso's synchronous tier work cost on the scheduler thread
over the whole run (spills: device -> host copies and L3 writes; load-backs: lookups and host -> device copies),
as time per call and as a share of its summed request latency. Writes ``benchmark/hicache.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import key_sha256, new_api_key
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port, iso_server_argv
from sglang_iso_testing.progress import Progress

HERE = Path(__file__).resolve().parent
CPU_HICACHE = ("--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--words", type=int, default=50, help="about 8 tokens per word with the bundled model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-tokens", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    key, admin = new_api_key(), new_api_key()
    work = Path(tempfile.mkdtemp(prefix="hicache-bench-"))
    (work / "secret.key").write_bytes(secrets.token_bytes(32))
    (work / "tenants.toml").write_text(
        f'namespace_secret_file = "secret.key"\nadmin_key_sha256 = ["{key_sha256(admin)}"]\n'
        f'[[tenants]]\nid = "solo"\nkey_sha256 = ["{key_sha256(key)}"]\n'
    )
    common = (
        "--max-total-tokens",
        str(args.device_tokens),
        "--max-running-requests",
        "8",
        "--enable-hierarchical-cache",
    )
    model = tiny_model_path()
    iso_port, base_port = free_port(), free_port()
    servers = {
        "sglang-iso": ServerProcess(
            iso_server_argv(iso_port, model, *common, "--tenants-file", str(work / "tenants.toml")), iso_port
        ),
        "upstream": ServerProcess(baseline_server_argv(base_port, model, *common, *CPU_HICACHE), base_port),
    }
    headers = {"sglang-iso": {"Authorization": f"Bearer {key}"}, "upstream": {}}
    rng = random.Random(args.seed)
    prompts = [prompt(args.words, rng) for _ in range(args.prompts)]
    order = [rng.sample(range(len(prompts)), len(prompts)) for _ in range(args.rounds)]
    results: dict[str, dict[str, Any]] = {}
    try:
        for srv in servers.values():
            srv.start()
        servers["upstream"].freeze_gc()
        progress = Progress("hicache", len(servers) * args.rounds * len(prompts), every_s=10)
        for name, srv in servers.items():
            rows = []
            for rnd, idx in ((r, i) for r, seq in enumerate(order) for i in seq):
                rows.append((rnd, *send(srv, headers[name], prompts[idx])))
                progress.step(note=name)
            results[name] = summarize(rows)
            if name == "sglang-iso":
                results[name]["tier_timing"] = tier_timing(srv, admin, sum(r[3] for r in rows))
        progress.finish()
    finally:
        for srv in servers.values():
            srv.stop()
    report(results, args)


def prompt(words: int, rng: random.Random) -> str:
    nonce = uuid.UUID(int=rng.getrandbits(128)).hex
    return f"{nonce} " + " ".join(f"w{i}x{nonce[:4]}" for i in range(words))


def send(srv: ServerProcess, headers: dict[str, str], text: str) -> tuple[int, int, float]:
    """(prompt tokens, cached tokens, seconds) of one request with one new token."""
    t0 = time.perf_counter()
    status, out = srv.post(
        "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}, headers=headers
    )
    elapsed = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {out}")
    meta = out["meta_info"]
    return int(meta["prompt_tokens"]), int(meta.get("cached_tokens", 0)), elapsed


def tier_timing(srv: ServerProcess, admin: str, request_s: float) -> dict[str, Any]:
    """The host tier's time counters (all rounds) from ``/get_server_info``, with ``request_s`` (summed latency)."""
    status, info = srv.get_with("/get_server_info", {"Authorization": f"Bearer {admin}"})
    if status != 200:
        raise RuntimeError(f"/get_server_info: HTTP {status}: {info}")
    tree = info["internal_states"][0]["sglang_iso"]["tree_cache"]
    out: dict[str, Any] = {k.removeprefix("tier_"): tree[k] for k in tree if k.startswith("tier_")}
    out["request_s"] = request_s
    return out


def summarize(rows: list[tuple[int, int, int, float]]) -> dict[str, Any]:
    warm = [r for r in rows if r[0] > 0]
    prompt_tokens = sum(r[1] for r in warm)
    cached = sum(r[2] for r in warm)
    ttft = [r[3] for r in warm]
    return {
        "requests": len(warm),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "hit_rate": cached / prompt_tokens if prompt_tokens else 0.0,
        "ttft_mean_ms": 1000 * sum(ttft) / len(ttft) if ttft else 0.0,
    }


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    iso, up = results["sglang-iso"], results["upstream"]
    print(f"\nworking set {args.prompts} x ~{args.words} words, device pool {args.device_tokens} tokens, rounds 2..")
    print(f"{'server':<12}{'hit rate':>10}{'TTFT ms':>10}{'requests':>10}")
    for name, r in results.items():
        print(f"{name:<12}{r['hit_rate']:>10.3f}{r['ttft_mean_ms']:>10.1f}{r['requests']:>10}")
    hit_ratio = iso["hit_rate"] / up["hit_rate"] if up["hit_rate"] else float("nan")
    ttft_ratio = iso["ttft_mean_ms"] / up["ttft_mean_ms"] if up["ttft_mean_ms"] else float("nan")
    print(f"ratio sglang-iso / upstream: hit rate {hit_ratio:.3f} (target >= 0.95), TTFT {ttft_ratio:.3f}")
    t = iso.get("tier_timing")
    if t:
        work_ms = (t["spill_us"] + t["load_us"]) / 1000
        print(
            "sglang-iso synchronous tier work on the scheduler thread (all rounds): "
            f"spill {t['spill_us'] / 1000:.1f} ms over {t['spill_calls']} evicted leaves "
            f"({t['spill_us'] / max(t['spill_calls'], 1) / 1000:.2f} ms each; "
            f"L3 writes {t['l3_write_us'] / 1000:.1f} ms), "
            f"load-back {t['load_us'] / 1000:.1f} ms over {t['load_calls']} lookups "
            f"({t['load_us'] / max(t['load_calls'], 1) / 1000:.2f} ms each); "
            f"{work_ms:.1f} ms = {100 * work_ms / (1000 * t['request_s']):.1f}% of its summed request latency"
        )
    out = {"args": vars(args), "results": results, "hit_rate_ratio": hit_ratio, "ttft_ratio": ttft_ratio}
    (HERE / "hicache.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
