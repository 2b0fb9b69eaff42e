"""``make demo`` / ``sglang-iso demo``: two tenants on the bundled model.

Writes a demo tenants file (fresh secret and keys, in a temporary folder),
starts the real SGLang server through sglang-iso's launcher with it, and shows:
a same-tenant cache hit, a cross-tenant miss on the very same prompt, a 401 for
an unknown key, an OpenAI chat completion, and the per-tenant cache statistics.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import key_sha256, new_api_key
from sglang_iso_testing.process import ServerProcess, ServerStartError, free_port, iso_server_argv

PROMPT = (
    "You are the support assistant of Example Corp. Answer briefly and politely. "
    "Customer: my order 1234 has not arrived yet, what can I do? Please check the tracking page first."
)
TENANTS = ("acme", "globex")


def write_demo_tenants(directory: Path) -> dict[str, str]:
    """A tenants file for ``TENANTS`` plus an admin key; returns the keys (shown once)."""
    keys = {name: new_api_key() for name in (*TENANTS, "admin")}
    (directory / "secret.key").write_bytes(secrets.token_bytes(32))
    lines = ['namespace_secret_file = "secret.key"', f'admin_key_sha256 = ["{key_sha256(keys["admin"])}"]', ""]
    for name in TENANTS:
        lines += ["[[tenants]]", f'id = "{name}"', f'key_sha256 = ["{key_sha256(keys[name])}"]', ""]
    (directory / "tenants.toml").write_text("\n".join(lines))
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-iso demo", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    parser.add_argument("--keep-running", action="store_true", help="leave the server running until Ctrl-C")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="sglang-iso-demo-"))
    keys = write_demo_tenants(workdir)
    port = args.port or free_port()
    argv_ = iso_server_argv(
        port, tiny_model_path(), "--max-total-tokens", "16384", "--enable-cache-report",
        "--tenants-file", str(workdir / "tenants.toml"),
    )  # fmt: skip
    server = ServerProcess(argv_, port, log_path=workdir / "server.log")
    print(f"sglang-iso demo: two tenants ({', '.join(TENANTS)}) on the bundled tiny model")
    print(f"  tenants file: {workdir / 'tenants.toml'}   server log: {server.log_path}")
    t0 = time.monotonic()
    try:
        server.start()
    except ServerStartError as exc:
        print(f"server failed to start (log and tenants file kept in {workdir}):\n{exc}", file=sys.stderr)
        return 1
    rc = 1
    try:
        print(f"  serving on {server.base_url}, ready in {time.monotonic() - t0:.1f}s\n")
        rc = _show(server, keys, keep_running=args.keep_running)
        return rc
    finally:
        server.stop()
        if rc == 0:
            shutil.rmtree(workdir, ignore_errors=True)  # the keys were demo-only; nothing to keep
        else:
            print(f"(server log and tenants file kept in {workdir})", file=sys.stderr)


def _show(server: ServerProcess, keys: dict[str, str], *, keep_running: bool) -> int:
    def generate(tenant: str) -> dict[str, Any]:
        status, out = server.post(
            "/generate",
            {"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "temperature": 0}},
            headers={"Authorization": f"Bearer {keys[tenant]}"},
        )
        if status != 200:
            raise RuntimeError(f"/generate for {tenant} failed ({status}): {out}")
        return out

    rows = []
    for step, tenant in (("first request", "acme"), ("same prompt again", "acme"), ("same prompt", "globex")):
        out = generate(tenant)
        rows.append((tenant, step, out["meta_info"]["prompt_tokens"], out["meta_info"]["cached_tokens"], out["text"]))
    print(f"{'tenant':<8} {'request':<18} {'prompt tok':>10} {'cached tok':>10}  output")
    for tenant, step, prompt_tokens, cached, text in rows:
        print(f"{tenant:<8} {step:<18} {prompt_tokens:>10} {cached:>10}  {text!r}")
    print("  -> acme reuses its own cache; globex sends the identical prompt and gets no hit.\n")

    status, out = server.post("/generate", {"text": PROMPT}, headers={"Authorization": "Bearer sk-iso-wrong"})
    print(f"unknown key -> HTTP {status}: {out['error']['message'] if isinstance(out, dict) else out}")

    status, chat = server.post(
        "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8},
        headers={"Authorization": f"Bearer {keys['globex']}"},
    )
    if status == 200:
        print(f"globex /v1/chat/completions -> {chat['choices'][0]['message']['content']!r}")

    status, stats = server.get_with("/iso/tenants", {"Authorization": f"Bearer {keys['admin']}"})
    if status == 200:
        print("\nper-tenant cache statistics (GET /iso/tenants, admin key):")
        print(
            f"{'tenant':<8} {'requests':>8} {'prompt tok':>10} {'cached tok':>10} {'resident':>9} {'lookup hits':>11} "
            f"{'inserted':>9} {'violations':>10}"
        )
        for tenant, info in stats["tenants"].items():
            served = info["served"]
            rank = info["ranks"][0] if info["ranks"] else {}
            print(
                f"{tenant:<8} {served['requests']:>8} {served['prompt_tokens']:>10} {served['cached_tokens']:>10} "
                f"{rank.get('resident_tokens', 0):>9} {rank.get('lookup_hit_tokens', 0):>11} "
                f"{rank.get('inserted_tokens', 0):>9} {rank.get('violations', 0):>10}"
            )
        print("(requests, prompt and cached tokens: what clients were served; lookup hits: tokens tree lookups found)")
    print("\n(the bundled model has random weights: its text is gibberish by design)")
    same, cross = rows[1][3], rows[2][3]
    if same <= 0 or cross != 0:
        print(f"unexpected cache behaviour: same-tenant hit {same}, cross-tenant hit {cross}", file=sys.stderr)
        return 1
    if keep_running:
        print(f"\nserving on {server.base_url}; keys: " + ", ".join(f"{k}={v}" for k, v in keys.items()))
        print("Ctrl-C to stop")
        try:
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
