"""The NGRAM timing channel: does tenant B decode faster on text tenant A generated?

Usage::

    python benchmark/spec_channel.py [--rounds 12] [--new-tokens 32]

Two servers, one at a time, both with ``--speculative-algorithm NGRAM`` (Triton attention; on CPU under the
Triton interpreter): upstream SGLang (one draft corpus for everyone) and sglang-iso (one corpus per tenant
namespace). Each round takes a fresh random prompt P (token ids) and sends, at temperature 0:

1. A: P (A's text is now in A's corpus, or in the global one upstream);
2. B: P ("B on A's text");
3. B: a fresh prompt Q ("B on fresh text");
4. A: P again (positive control: the same tenant repeating its own text).

Tokens per second (completion tokens / client-side request time) and each request's accept length are
collected; a one-sided two-sample KS test asks whether B on A's text is faster than B on fresh text (the
channel), and whether A's repeat is (the control). Upstream has no tenants, so there B's prefix-cache hit on
P adds to the channel. Prints a table with medians, ratios and p-values, with progress (rate, ETA), and writes
``benchmark/spec_channel.json``. Goal: upstream shows the channel (p < 0.01), sglang-iso does not (p > 0.05)
while its control does (p < 0.01).
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from scipy.stats import ks_2samp

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import key_sha256, new_api_key
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port, iso_server_argv

HERE = Path(__file__).resolve().parent
SERVERS = ("upstream", "sglang-iso")
KINDS = ("B on A's text", "B on fresh text", "A repeat")
SPEC_FLAGS = (
    "--attention-backend", "triton", "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8",
    "--max-total-tokens", "16384", "--max-running-requests", "8",
)  # fmt: skip


def write_tenants(directory: Path, keys: dict[str, str]) -> Path:
    (directory / "secret.key").write_bytes(secrets.token_bytes(32))
    lines = ['namespace_secret_file = "secret.key"', ""]
    for tenant in ("alpha", "beta"):
        lines += ["[[tenants]]", f'id = "{tenant}"', f'key_sha256 = ["{key_sha256(keys[tenant])}"]', ""]
    path = directory / "tenants.toml"
    path.write_text("\n".join(lines))
    return path


def start(name: str, workdir: Path, keys: dict[str, str]) -> ServerProcess:
    port = free_port()
    env = {"TRITON_INTERPRET": "1"}  # NOTE: the Triton backend needs the interpreter on CPU (harmless on GPU)
    if name == "upstream":
        argv = baseline_server_argv(port, tiny_model_path(), *SPEC_FLAGS)  # (adds the CPU flags without CUDA)
    else:
        tenants = write_tenants(workdir, keys)
        argv = iso_server_argv(port, tiny_model_path(), *SPEC_FLAGS, "--tenants-file", str(tenants))
    return ServerProcess(argv, port, env=env)


def generate(server: ServerProcess, key: str | None, ids: list[int], new_tokens: int) -> tuple[float, float]:
    """(tokens per second, accept length) of one request."""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    t0 = time.perf_counter()
    status, out = server.post("/generate", body, headers=headers, timeout_s=600)
    elapsed = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"/generate answered {status}: {out}")
    meta = out["meta_info"]
    return meta["completion_tokens"] / elapsed, float(meta.get("spec_accept_length") or 0.0)


def run_server(name: str, args: argparse.Namespace, keys: dict[str, str], workdir: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    server = start(name, workdir, keys)
    a, b = (None, None) if name == "upstream" else (keys["alpha"], keys["beta"])
    tps: dict[str, list[float]] = {k: [] for k in KINDS}
    accept: dict[str, list[float]] = {k: [] for k in KINDS}
    try:
        server.start(timeout_s=400)
        t0 = time.monotonic()
        for i in range(args.rounds):
            prompt = [rng.randrange(300, 2000) for _ in range(24)]
            fresh = [rng.randrange(300, 2000) for _ in range(24)]
            generate(server, a, prompt, args.new_tokens)
            for kind, key, ids in ((KINDS[0], b, prompt), (KINDS[1], b, fresh), (KINDS[2], a, prompt)):
                speed, length = generate(server, key, ids, args.new_tokens)
                tps[kind].append(speed)
                accept[kind].append(length)
            rate = (i + 1) / (time.monotonic() - t0)
            eta = (args.rounds - i - 1) / rate
            print(f"  {name}: round {i + 1}/{args.rounds}, {rate:.2f} rounds/s, ETA {eta:.0f}s", flush=True)
    finally:
        server.stop()
    fresh_tps = tps[KINDS[1]]
    return {
        "tokens_per_s": tps,
        "accept_length": accept,
        "p_channel": float(ks_2samp(tps[KINDS[0]], fresh_tps, alternative="less").pvalue),
        "p_control": float(ks_2samp(tps[KINDS[2]], fresh_tps, alternative="less").pvalue),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    keys = {t: new_api_key() for t in ("alpha", "beta")}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SERVERS:
            results[name] = run_server(name, args, keys, Path(tmp))
    print(f"\n{'server':<11} {'kind':<16} {'tok/s p50':>9} {'vs fresh':>8} {'accept p50':>10}")
    for name in SERVERS:
        res = results[name]
        fresh = statistics.median(res["tokens_per_s"][KINDS[1]])
        for kind in KINDS:
            med = statistics.median(res["tokens_per_s"][kind])
            acc = statistics.median(res["accept_length"][kind])
            print(f"{name:<11} {kind:<16} {med:>9.1f} {med / fresh:>8.2f} {acc:>10.2f}")
        print(f"{name:<11} KS p (B on A's text faster than fresh) = {res['p_channel']:.2g}; "
              f"control (A repeat faster) = {res['p_control']:.2g}")  # fmt: skip
    out = HERE / "spec_channel.json"
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
