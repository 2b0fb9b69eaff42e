"""``python -m sglang_iso.launch_server``: SGLang's server with the tenant cache.

The CPU shims are applied at import, before anything imports SGLang. SGLang
starts its scheduler and detokenizer with the ``spawn`` start method, which
re-imports this module (as ``__mp_main__``) in each child before unpickling its
target, so every SGLang process gets them.
"""

from __future__ import annotations

from sglang_iso import envvars
from sglang_iso.platform import bootstrap

bootstrap.apply()


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import logging
    import os
    import sys

    from sglang_iso.server.args import add_iso_args, plan_launch

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        from sglang_iso.integration.server import add_sglang_cli_args

        parser = argparse.ArgumentParser(prog="sglang-iso serve", allow_abbrev=False)
        add_sglang_cli_args(parser)
        add_iso_args(parser)
        parser.print_help()
        return 0

    from sglang_iso.plugin import test_plugin_refusal

    refusal = test_plugin_refusal(os.environ)
    if refusal is not None:
        print(f"sglang-iso: error: {refusal}", file=sys.stderr)
        return 2
    try:
        plan = plan_launch(args, cuda_available=bootstrap.cuda_available(), env=dict(os.environ))
        if plan.tenants_file is not None:
            from sglang_iso.tenancy.config import load_tenants_file

            config = load_tenants_file(plan.tenants_file)
    except ValueError as exc:  # includes ConfigError, which names the file, field and line
        print(f"sglang-iso: error: {exc}", file=sys.stderr)
        return 2
    if plan.dry_run:
        print(
            json.dumps(
                {
                    "sglang_argv": plan.sglang_argv,
                    "added": plan.added,
                    "tenants_file": plan.tenants_file,
                    "kv_scrub": plan.kv_scrub,
                    "env_added": dict(plan.env_added),
                }
            )
        )
        return 0
    os.environ[envvars.REQUIRE_TENANT_CACHE.name] = "1"
    for name, value in plan.env_added:
        os.environ[name] = value
        logging.getLogger("sglang_iso").warning("sglang-iso: added environment default: %s=%s", name, value)

    os.environ[envvars.KV_SCRUB.name] = plan.kv_scrub

    os.environ[envvars.KV_OWNER_CHECK.name] = plan.kv_owner_check
    if plan.audit_log is not None:
        os.environ[envvars.AUDIT_LOG.name] = plan.audit_log
    if plan.tenants_file is not None:
        os.environ[envvars.TENANTS_FILE.name] = plan.tenants_file
        os.environ[envvars.METRICS_AUTH.name] = plan.metrics_auth
        logging.getLogger("sglang_iso").warning(
            "sglang-iso: %d tenants from %s", len(config.tenants), plan.tenants_file
        )
    if plan.added:
        logging.getLogger("sglang_iso").warning("sglang-iso: added defaults: %s", " ".join(plan.added))
    from sglang_iso.integration.server import serve

    serve(plan.sglang_argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
