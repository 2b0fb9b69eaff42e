"""``python -m sglang_iso.launch_server``: SGLang's server with the tenant cache.

The CPU shims are applied at import, before anything imports SGLang. SGLang
starts its scheduler and detokenizer with the ``spawn`` start method, which
re-imports this module (as ``__mp_main__``) in each child before unpickling its
target, so every SGLang process gets them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang_iso import envvars, settings
from sglang_iso.platform import bootstrap
from sglang_iso.settings import Settings

if TYPE_CHECKING:
    from sglang_iso.server.args import LaunchPlan

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

    try:
        plan = plan_launch(args, cuda_available=bootstrap.cuda_available(), env=dict(os.environ))
        if plan.tenants_file is not None:
            from sglang_iso.tenancy.config import load_tenants_file

            config = load_tenants_file(plan.tenants_file)
        launch_env = _launch_env(plan)
        launch_settings = Settings.from_env({**os.environ, **launch_env})  # NOTE: what every process will read
        refusal = test_plugin_refusal(launch_settings)
        if refusal is not None:
            raise ValueError(refusal)
        if launch_settings.baseline:
            raise ValueError(
                f"{envvars.BASELINE.name}=1 makes a plain upstream server without tenant isolation; refusing to "
                "start sglang-iso with it (unset it)"
            )
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
    for name, value in plan.env_added:
        logging.getLogger("sglang_iso").warning("sglang-iso: added environment default: %s=%s", name, value)
    os.environ.update(launch_env)
    settings.reset()  # NOTE: this process serves HTTP: it reads what it just set, not what it saw at import
    if plan.tenants_file is not None:
        logging.getLogger("sglang_iso").warning(
            "sglang-iso: %d tenants from %s", len(config.tenants), plan.tenants_file
        )
    if plan.added:
        logging.getLogger("sglang_iso").warning("sglang-iso: added defaults: %s", " ".join(plan.added))
    from sglang_iso.integration.server import serve

    serve(plan.sglang_argv)
    return 0


def _launch_env(plan: LaunchPlan) -> dict[str, str]:
    """The ``SGLANG_ISO_*`` variables this launch sets; every SGLang process it spawns inherits them."""
    env = {envvars.REQUIRE_TENANT_CACHE.name: "1", **dict(plan.env_added)}
    env[envvars.KV_SCRUB.name] = plan.kv_scrub
    env[envvars.KV_OWNER_CHECK.name] = plan.kv_owner_check
    if plan.audit_log is not None:
        env[envvars.AUDIT_LOG.name] = plan.audit_log
    if plan.tenants_file is not None:
        env[envvars.TENANTS_FILE.name] = plan.tenants_file
        env[envvars.METRICS_AUTH.name] = plan.metrics_auth
    return env


if __name__ == "__main__":
    raise SystemExit(main())
