"""Shared prompt at scale: N tenants (default 100) send one public system prompt plus their own question.

Three servers, same bundled model, same requests, one run:

* ``upstream``: plain SGLang, global sharing (no keys): the ceiling for reuse and what isolation must not lose.
* ``iso-shared``: sglang-iso, the system prompt declared as a shared prefix readable by every tenant.
* ``iso-private``: sglang-iso, the same tenants without the declaration (per-tenant isolation only).

Prints the hit rate (cached prompt tokens / prompt tokens) of each and the ratio to upstream; target for
``iso-shared``: >= 95% of upstream's.

    python benchmark/shared_prompt.py [--tenants 100]
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_iso.platform import bootstrap  # noqa: E402

bootstrap.apply()

from sglang_iso.models import tiny_model_path  # noqa: E402
from sglang_iso.tenancy.keys import key_sha256, new_api_key  # noqa: E402
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port, iso_server_argv  # noqa: E402

SYSTEM = " ".join(f"Guideline {i}: answer from the handbook, be brief, be kind, never guess." for i in range(24))
SIZES = ("--max-total-tokens", "131072", "--max-running-requests", "16")


def write_tenants(directory: Path, n: int, *, shared: bool) -> tuple[Path, list[str]]:
    (directory / "s.key").write_bytes(secrets.token_bytes(32))
    keys = [new_api_key() for _ in range(n)]
    lines = ['namespace_secret_file = "s.key"']
    for i, key in enumerate(keys):
        lines += ["[[tenants]]", f'id = "tenant{i}"', f'key_sha256 = ["{key_sha256(key)}"]']
    if shared:
        lines += ["[[shared_prefixes]]", 'name = "handbook"', f'text = "{SYSTEM}"', 'tenants = ["*"]']
    path = directory / f"tenants-{'shared' if shared else 'private'}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, keys


def run(name: str, argv_extra: tuple[str, ...], keys: list[str | None], questions: list[str]) -> tuple[int, int]:
    port = free_port()
    model = tiny_model_path()
    if name == "upstream":
        argv = baseline_server_argv(port, model, *SIZES)
    else:
        argv = iso_server_argv(port, model, *SIZES, *argv_extra)
    with ServerProcess(argv, port) as server:
        server.start(timeout_s=600)

        def one(i: int) -> tuple[int, int]:
            key = keys[i % len(keys)]
            status, out = server.post(
                "/generate",
                {"text": SYSTEM + " Question: " + questions[i], "sampling_params": {"max_new_tokens": 1}},
                headers={"Authorization": f"Bearer {key}"} if key else None,
                timeout_s=300,
            )
            if status != 200:
                raise RuntimeError(f"{name}: HTTP {status}: {out}")
            return int(out["meta_info"]["cached_tokens"]), int(out["meta_info"]["prompt_tokens"])

        # The first request fills the cache; the rest arrive 4 at a time.
        first = one(0)
        with ThreadPoolExecutor(max_workers=4) as pool:
            rest = list(pool.map(one, range(1, len(questions))))
    cached = first[0] + sum(c for c, _ in rest)
    prompt = first[1] + sum(p for _, p in rest)
    return cached, prompt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=100)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="sglang-iso-shared-"))
    questions = [
        f"ticket {i:04d} {secrets.token_hex(6)}: where is my parcel number {i * 7919}?" for i in range(args.tenants)
    ]
    shared_file, shared_keys = write_tenants(workdir, args.tenants, shared=True)
    private_file, private_keys = write_tenants(workdir, args.tenants, shared=False)
    results = {
        "upstream": run("upstream", (), [None], questions),
        "iso-shared": run("iso-shared", ("--tenants-file", str(shared_file)), list(shared_keys), questions),
        "iso-private": run("iso-private", ("--tenants-file", str(private_file)), list(private_keys), questions),
    }
    base = results["upstream"][0] / results["upstream"][1]
    print(f"{args.tenants} tenants, one request each: system prompt + own question")
    print("| server | cached tokens | prompt tokens | hit rate | vs upstream |\n|---|---|---|---|---|")
    for name, (cached, prompt) in results.items():
        rate = cached / prompt
        print(f"| {name} | {cached} | {prompt} | {100 * rate:.1f}% | {rate / base:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
