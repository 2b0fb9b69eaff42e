"""Long leak-fuzzing run (e.g. 100k operations) against a real sglang-iso server on the bundled model.

    python benchmark/leak_fuzz.py --ops 100000 --max-seconds 36000 --seed 1

Prints a progress line every ``--progress-s`` seconds (operations done, rate, elapsed, ETA, and the counters so
far), then the report (requests, answers, same-owner hits, leaks, errors) and the final oracle checks.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sglang_iso.platform import bootstrap

bootstrap.apply()

from sglang_iso.models import tiny_model_path  # noqa: E402
from sglang_iso_testing.leak_fuzzer import LeakFuzzer, server_flags, shared_prefix_ids, write_tenants  # noqa: E402
from sglang_iso_testing.process import ServerProcess, free_port, iso_server_argv  # noqa: E402
from sglang_iso_testing.progress import Progress  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--max-seconds", type=float, default=36_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--progress-s", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here (for sglang-iso evidence)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="sglang-iso-fuzz-"))
    tenants_file, tenants, admin = write_tenants(workdir)
    port = free_port()
    server = ServerProcess(iso_server_argv(port, tiny_model_path(), *server_flags(tenants_file)), port)
    t0 = time.monotonic()
    with server:
        server.start()
        fuzzer = LeakFuzzer(server, tenants, admin, shared_prefix_ids(tiny_model_path()), args.seed)
        progress = Progress("leak fuzz", args.ops, unit="ops", every_s=args.progress_s, max_seconds=args.max_seconds)
        report = fuzzer.run(args.ops, max_seconds=args.max_seconds, progress=progress)
        progress.finish()
        problems = fuzzer.final_checks()
    print(f"operations budget {args.ops}, seed {args.seed}, {time.monotonic() - t0:.0f}s")
    print(
        f"requests {report.requests}  answered {report.ok}  refused {report.refused}  "
        f"same-owner hits {report.same_owner_hits}"
    )
    print(f"leaks {len(report.leaks)}  errors {len(report.errors)}  final-check problems {len(problems)}")
    for line in [*report.leaks, *report.errors, *problems][:50]:
        print("  " + line)
    if args.json is not None:
        result = {
            "seed": args.seed,
            "operations_budget": args.ops,
            "seconds": round(time.monotonic() - t0, 1),
            "requests": report.requests,
            "answered": report.ok,
            "same_owner_hits": report.same_owner_hits,
            "leaks": len(report.leaks),
            "errors": len(report.errors),
            "final_check_problems": len(problems),
        }
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if not (report.leaks or report.errors or problems) else 1


if __name__ == "__main__":
    raise SystemExit(main())
