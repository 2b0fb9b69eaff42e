"""``python -m sglang_iso.baseline_server``: plain upstream SGLang, for comparison.

Runs SGLang's own server with its default tree cache and only the CPU shims
applied (and, without CUDA, the same CPU flags as sglang-iso's launcher):
``SGLANG_ISO_BASELINE=1`` tells the plugin in every SGLang process to register
none of sglang-iso's hooks (unless the tenant cache is required). It is
the unhardened baseline that benchmarks and the audit run side by side with
sglang-iso; never serve tenants with it.
"""

from __future__ import annotations

import os

from sglang_iso import envvars, settings
from sglang_iso.platform import bootstrap

bootstrap.apply()


def main(argv: list[str] | None = None) -> int:
    import sys

    from sglang_iso.server.args import CPU_DEFAULTS, has_flag

    args = list(sys.argv[1:] if argv is None else argv)
    os.environ[envvars.BASELINE.name] = "1"  # NOTE: inherited by every SGLang process: the plugin registers no hook
    settings.reset()
    if not bootstrap.cuda_available():
        for flag, value in CPU_DEFAULTS:
            if not has_flag(args, flag):
                args += [flag] if value is None else [flag, value]
    from sglang_iso.integration.server import serve

    serve(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
