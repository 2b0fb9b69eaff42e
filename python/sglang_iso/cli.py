"""The ``sglang-iso`` command."""

from __future__ import annotations

# NOTE: imported first because ``spawn`` children of ``sglang-iso serve`` re-run
# the console script, and the shims must precede every SGLang import there too.
from sglang_iso.platform import bootstrap

bootstrap.apply()

import argparse  # noqa: E402
import sys  # noqa: E402

USAGE = """sglang-iso COMMAND [ARGS]

commands:
  serve [SGLANG AND SGLANG-ISO FLAGS]   start the server (see `sglang-iso serve --help`)
  demo [--port PORT]                    serve the bundled tiny model and show a cache hit
  audit --base-url URL --victim-key K --attacker-key K2 [...]
                                        prompt-cache side-channel audit (KS test on TTFT, cached_tokens oracle)
  evidence --tenants-file FILE [--base-url URL] [--audit-json F] [--leak-fuzz-json F] [--out-dir DIR]
                                        one report for an auditor: configuration, counters, test results, checks
  router [SGLANG-ROUTER FLAGS]          run sglang-router (python -m sglang_router.launch_router) on this install
  router --pd-disaggregation --tenants-file FILE [--router-key-env VAR] [SGLANG-ROUTER FLAGS]
                                        the PD router behind sglang-iso's front gate (its own router key)
  keys new --tenant ID | --admin        mint an API key; prints it once and its key_sha256 line
  keys hash                             hash a key read from stdin
  check-config FILE                     validate a tenants file without starting a server
  cpu-hook install | remove | status    the interpreter-start hook that lets `import sglang` work on CPU-only torch
  model-path                            print the path of the bundled tiny model
  version                               print versions
"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        from sglang_iso.launch_server import main as serve_main

        return serve_main(rest)
    if command == "demo":
        try:
            from sglang_iso_testing.demo import main as demo_main
        except ImportError:
            print("sglang-iso demo: needs the test harness (testing/, installed by `make install`)", file=sys.stderr)
            return 2
        return demo_main(rest)
    if command == "audit":
        from sglang_iso.audit import main as audit_main

        return audit_main(rest)
    if command == "evidence":
        from sglang_iso.audit.evidence import main as evidence_main

        return evidence_main(rest)
    if command == "router":
        return _router(rest)
    if command == "keys":
        from sglang_iso.tenancy.operator_commands import keys_main

        return keys_main(rest)
    if command == "check-config":
        from sglang_iso.tenancy.operator_commands import check_config_main

        return check_config_main(rest)
    if command == "cpu-hook":
        return _cpu_hook(rest)
    if command == "model-path":
        from sglang_iso.models import tiny_model_path

        print(tiny_model_path())
        return 0
    if command == "version":
        return _version()
    print(f"sglang-iso: unknown command {command!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 2


def _router(argv: list[str]) -> int:
    """Run sglang-router's launcher with these arguments (after the CPU shims: it imports torch).

    With ``--pd-disaggregation --tenants-file``: behind sglang-iso's front gate (``server/pd_router.py``).
    """

    if "--pd-disaggregation" in argv and any(a == "--tenants-file" or a.startswith("--tenants-file=") for a in argv):
        from sglang_iso.server.pd_router import run

        return run(argv)
    if "--pd-disaggregation" in argv:
        print("sglang-iso router: --pd-disaggregation needs --tenants-file (workers accept only the router key)",
              file=sys.stderr)  # fmt: skip
        return 2
    return run_plain_router(argv)


def run_plain_router(argv: list[str]) -> int:
    """sglang-router's own launcher, unchanged (the front gate starts it through this)."""
    import runpy

    sys.argv = ["sglang-iso router", *argv]
    runpy.run_module("sglang_router.launch_router", run_name="__main__", alter_sys=True)
    return 0


def _cpu_hook(argv: list[str]) -> int:
    """Write, remove or show the ``.pth`` file that applies the CPU shims at interpreter start."""
    from sglang_iso.platform import startup

    parser = argparse.ArgumentParser(prog="sglang-iso cpu-hook", description=startup.__doc__)
    parser.add_argument("action", choices=["install", "remove", "status"])
    parser.add_argument("--site-packages", default=None, help="target directory (default: this interpreter's)")
    args = parser.parse_args(argv)
    path = startup.pth_path(args.site_packages)
    if args.action == "install":
        print(f"installed {startup.write_pth(args.site_packages)}")
    elif args.action == "remove":
        print(f"removed {path}" if startup.remove_pth(args.site_packages) else f"not installed: {path}")
    else:
        print(f"{'installed' if path.exists() else 'not installed'}: {path}")
    return 0


def _version() -> int:
    from importlib.metadata import version

    from sglang_iso.integration.symbols import PINNED_SGLANG_VERSION

    parser = argparse.ArgumentParser(prog="sglang-iso version")
    parser.parse_args([])
    print(f"sglang-iso {version('sglang-iso')}")
    print(f"sglang {version('sglang')} (pinned {PINNED_SGLANG_VERSION})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
