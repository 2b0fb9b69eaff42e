"""What encryption at rest costs an L3 page: the encrypted store against plaintext files with an HMAC, side by side.

Usage::

    python benchmark/l3_crypto.py [--rounds R] [--pages N] [--sizes 16384,262144,4194304]

Per page size, in alternating rounds (this machine's noise is larger than most effects), each of:

* ``encrypted``: :class:`sglang_iso.integration.l3_store.FileL3Store` ``write`` then ``read`` of N pages (AES-256-GCM
  under the tenant's key, name and header as associated data);
* ``plaintext``: the same files written and read back with the former format's protection only, an HMAC-SHA-256
  over name and bytes (no encryption), through the same temporary-file-and-rename write.

Prints per-page medians and P99 of write and read, and the ratios encrypted / plaintext. Both go through the
page cache (no fsync), as the store does, so the ratio is the CPU cost of the cryptography against file I/O.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sglang_iso.integration.l3_store import FileL3Store

SECRET = os.urandom(32)
FINGERPRINT = b"benchmark-model"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def encrypted_round(directory: Path, size: int, pages: int, payload: bytes) -> tuple[list[float], list[float]]:
    store = FileL3Store(directory, SECRET, FINGERPRINT, size, lambda ns: ns.split(":")[0])
    writes, reads = [], []
    for i in range(pages):
        digest = i.to_bytes(8, "big")
        t0 = time.perf_counter()
        store.write("acme:ns", digest, payload)
        writes.append(time.perf_counter() - t0)
    for i in range(pages):
        t0 = time.perf_counter()
        out = store.read("acme:ns", i.to_bytes(8, "big"))
        reads.append(time.perf_counter() - t0)
        if out != payload:
            sys.exit("encrypted read returned other bytes")
    return writes, reads


def plaintext_round(directory: Path, size: int, pages: int, payload: bytes) -> tuple[list[float], list[float]]:
    key = hmac.new(SECRET, FINGERPRINT, hashlib.sha256).digest()
    writes, reads = [], []
    for i in range(pages):
        name = hmac.new(key, i.to_bytes(8, "big"), hashlib.sha256).hexdigest() + ".kv"
        t0 = time.perf_counter()
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(payload + hmac.new(key, name.encode() + payload, hashlib.sha256).digest())
        os.replace(tmp, directory / name)
        writes.append(time.perf_counter() - t0)
    for i in range(pages):
        name = hmac.new(key, i.to_bytes(8, "big"), hashlib.sha256).hexdigest() + ".kv"
        t0 = time.perf_counter()
        data = (directory / name).read_bytes()
        body, tag = data[:-32], data[-32:]
        ok = hmac.compare_digest(tag, hmac.new(key, name.encode() + body, hashlib.sha256).digest())
        reads.append(time.perf_counter() - t0)
        if not ok or body != payload:
            sys.exit("plaintext read failed")
    return writes, reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pages", type=int, default=64)
    parser.add_argument("--sizes", default="16384,262144,4194304", help="page bytes, comma-separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes: dict[str, Callable[[Path, int, int, bytes], tuple[list[float], list[float]]]] = {
        "plaintext": plaintext_round,
        "encrypted": encrypted_round,
    }
    print(f"{'page bytes':>11} {'mode':>10} {'write p50 ms':>13} {'write p99 ms':>13} {'read p50 ms':>12} "
          f"{'read p99 ms':>12}")  # fmt: skip
    for size in sizes:
        payload = os.urandom(size)
        samples: dict[str, tuple[list[float], list[float]]] = {m: ([], []) for m in modes}
        started = time.monotonic()
        for r in range(args.rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))  # alternate who goes first
            for mode in order:
                with tempfile.TemporaryDirectory() as d:
                    w, rd = modes[mode](Path(d), size, args.pages, payload)
                samples[mode][0].extend(w)
                samples[mode][1].extend(rd)
            left = (time.monotonic() - started) / (r + 1) * (args.rounds - r - 1)
            print(f"  size {size}: round {r + 1}/{args.rounds} done, ETA {left:.0f} s", file=sys.stderr)
        row = {}
        for mode, (w, rd) in samples.items():
            row[mode] = (statistics.median(w), _pct(w, 0.99), statistics.median(rd), _pct(rd, 0.99))
            print(f"{size:>11} {mode:>10} " + " ".join(f"{v * 1e3:>12.3f}" for v in row[mode]))
        ratios = [e / p for e, p in zip(row["encrypted"], row["plaintext"], strict=True)]
        print(f"{size:>11} {'ratio':>10} " + " ".join(f"{v:>12.2f}x" for v in ratios))


if __name__ == "__main__":
    main()
