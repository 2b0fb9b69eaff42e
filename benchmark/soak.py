"""A million operations on the tenant cache in process (``sglang_iso_testing/soak.py``), with progress.

    python benchmark/soak.py --ops 1000000 --tenants 1000 --seed 1 [--page-size 4] [--host-tokens 8192]

Prints a progress line every ``--progress-s`` seconds (operations, rate, ETA), then the totals: requests, same-tenant
hit tokens (the positive control), slots verified, checks run, and the failure with its replay command, if any.
Exit code 1 on a failure.
"""

from __future__ import annotations

import argparse
import time

from sglang_iso.platform import bootstrap

bootstrap.apply()

import torch  # noqa: E402

from sglang_iso_testing.progress import Progress  # noqa: E402
from sglang_iso_testing.soak import Soak, SoakConfig  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--pool-tokens", type=int, default=65536)
    parser.add_argument("--host-tokens", type=int, default=0)
    parser.add_argument("--check-every", type=int, default=1000)
    parser.add_argument("--plant", choices=["double_hand", "overwrite"], default=None)
    parser.add_argument("--plant-at", type=int, default=750)
    parser.add_argument("--progress-s", type=float, default=30.0)
    args = parser.parse_args()
    # NOTE: one thread, as the scheduler's cache work is: torch's intra-op threads on these small tensors only
    # contend with each other (measured: 6x slower on a busy 2-core machine).
    torch.set_num_threads(1)
    config = SoakConfig(seed=args.seed, tenants=args.tenants, page_size=args.page_size, pool_tokens=args.pool_tokens,
                        host_tokens=args.host_tokens, check_every=args.check_every, plant=args.plant,
                        plant_at=args.plant_at)  # fmt: skip
    t0 = time.monotonic()
    progress = Progress("soak", args.ops, unit="ops", every_s=args.progress_s)
    result = Soak(config).run(args.ops, progress=progress)
    progress.finish()
    seconds = time.monotonic() - t0
    print(f"{result.ops} operations in {seconds:.0f} s ({result.ops / seconds:.0f} ops/s), seed {args.seed}, "
          f"{args.tenants} tenants, page size {args.page_size}, host tier {args.host_tokens} tokens")  # fmt: skip
    print(f"requests {result.requests}, matched {result.matched_requests}, same-tenant hit tokens {result.hit_tokens}, "
          f"slots verified {result.verified_slots}, checks {result.checks}, evictions {result.evictions}, "
          f"flushes {result.flushes}, operations {result.counts}")  # fmt: skip
    print(f"failure: {result.failure}" if result.failure else "violations: 0")
    return 1 if result.failure else 0


if __name__ == "__main__":
    raise SystemExit(main())
