"""Full-size prompt-cache audit (Gu et al., ICML 2025) of upstream SGLang and sglang-iso, one after the other.

Usage::

    python benchmark/audit.py [--samples 250] [--prompt-tokens 1500] [--api openai] [--out-dir benchmark/audit-out]

Upstream runs without keys (one global cache, as every client of an open server sees it); its scopes are
same-key and other-tenant (another anonymous client). sglang-iso runs with a tenants file: victim ``acme``
(two keys), attacker ``globex``; scopes same-key, same-tenant (second acme key) and other-tenant. Each server
is started, audited with :func:`sglang_iso.audit.run_audit` and stopped before the next starts (an idle SGLang
scheduler busy-polls about half a core on CPU). Per server, ``audit.md``/``audit.json``/``audit.png`` go to
``<out-dir>/<server>/``; the combined table is printed.

At the defaults this takes about 20-30 minutes on a 2-core CPU (250 samples x 4 requests x 5 scopes).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path

from sglang_iso.audit import AuditConfig, run_audit, write_outputs
from sglang_iso.audit.report import table
from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import key_sha256, new_api_key
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port, iso_server_argv

SIZES = ("--max-total-tokens", "32768", "--max-running-requests", "16", "--enable-cache-report")


def write_tenants(directory: Path) -> tuple[Path, dict[str, str]]:
    """Tenants acme (two keys) and globex, private caches."""
    (directory / "secret.key").write_bytes(secrets.token_bytes(32))
    keys = {name: new_api_key() for name in ("acme", "acme-2", "globex")}
    lines = ['namespace_secret_file = "secret.key"', f'admin_key_sha256 = ["{key_sha256(new_api_key())}"]', ""]
    for tenant, tenant_keys in (("acme", ("acme", "acme-2")), ("globex", ("globex",))):
        hashes = ", ".join(f'"{key_sha256(keys[k])}"' for k in tenant_keys)
        lines += ["[[tenants]]", f'id = "{tenant}"', f"key_sha256 = [{hashes}]", 'cache = "private"', ""]
    path = directory / "tenants.toml"
    path.write_text("\n".join(lines))
    return path, keys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=250, help="hit candidates per scope, as many misses")
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--api", choices=("openai", "sglang"), default="openai")
    p.add_argument("--timing", choices=("ttft", "total"), default="ttft")
    p.add_argument("--alpha", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--servers", default="upstream,iso", help="subset of upstream,iso, run in this order")
    p.add_argument("--out-dir", type=Path, default=Path("benchmark/audit-out"))
    p.add_argument("--max-minutes", type=float, default=60.0, help="per server: stop sampling after this long")
    args = p.parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    if not servers or set(servers) - {"upstream", "iso"}:
        p.error("--servers: a subset of upstream,iso")
    model = tiny_model_path()
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sglang-iso-audit-") as tmp:
        tenants_file, keys = write_tenants(Path(tmp))
        for name in servers:
            port = free_port()
            if name == "upstream":
                argv_ = baseline_server_argv(port, model, *SIZES)
                key_args: dict[str, str | None] = {"victim_key": None, "attacker_key": None, "same_tenant_key": None}
            else:
                argv_ = iso_server_argv(port, model, *SIZES, "--tenants-file", str(tenants_file))
                key_args = {
                    "victim_key": keys["acme"],
                    "attacker_key": keys["globex"],
                    "same_tenant_key": keys["acme-2"],
                }
            t0 = time.monotonic()
            with ServerProcess(argv_, port).start(timeout_s=600) as server:
                config = AuditConfig(
                    base_url=server.base_url,
                    api=args.api,
                    timing=args.timing,
                    samples=args.samples,
                    prompt_tokens=args.prompt_tokens,
                    alpha=args.alpha,
                    seed=args.seed,
                    max_seconds=args.max_minutes * 60.0,
                    **key_args,
                )
                report = run_audit(config, log=lambda m, n=name: print(f"{n}: {m}", flush=True))
            out = args.out_dir / name
            write_outputs(report, out)
            head, sep, *body = table(report.results).splitlines()
            rows += [f"| {name} {row}" for row in body]
            print(f"{name}: done in {time.monotonic() - t0:.0f}s; outputs in {out}", flush=True)
    print("\n".join([f"| server {head}", f"|---{sep}", *rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
