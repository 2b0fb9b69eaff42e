"""sglang-iso's launcher flags and the SGLang defaults it selects.

The launcher accepts every SGLang server flag unchanged. It adds its own flags in
an ``sglang-iso`` argument group, and fills in SGLang flags only where the user
did not set them: ``--radix-cache-backend tenant`` always, and on a machine
without CUDA the CPU settings that serve (``--device cpu``, ``--attention-backend
torch_native``, ``--disable-cuda-graph``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NamedTuple

TENANT_BACKEND = "tenant"

# (flag, value or None for a switch): SGLang flags the CPU default set adds.
CPU_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--disable-cuda-graph", None),
)


class LaunchPlan(NamedTuple):
    """What the launcher will run."""

    sglang_argv: list[str]  # passed unchanged to SGLang's own parser
    added: list[str]  # the defaults sglang-iso filled in (for the startup log)
    dry_run: bool


def add_iso_args(parser: argparse.ArgumentParser) -> None:
    """Add sglang-iso's own flags in their own group."""
    group = parser.add_argument_group("sglang-iso")
    group.add_argument(
        "--iso-cpu-defaults",
        choices=["auto", "off"],
        default="auto",
        help="auto: without CUDA, add the CPU flags that serve unless given (default); off: add none.",
    )
    group.add_argument(
        "--iso-dry-run",
        action="store_true",
        help="Print the SGLang arguments the launcher would run, as JSON, and exit.",
    )


def iso_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_iso_args(parser)
    return parser


def plan_launch(argv: Sequence[str], *, cuda_available: bool) -> LaunchPlan:
    """Split ``argv`` into our flags and SGLang's, and add the defaults.

    Raises:
        ValueError: ``--radix-cache-backend`` names another backend; sglang-iso
            never serves with a tree cache that is not the tenant cache.
    """
    ours, rest = iso_parser().parse_known_args(list(argv))
    sglang_argv = list(rest)
    added: list[str] = []

    backend = _flag_value(sglang_argv, "--radix-cache-backend")
    if backend is None:
        sglang_argv += ["--radix-cache-backend", TENANT_BACKEND]
        added += ["--radix-cache-backend", TENANT_BACKEND]
    elif backend != TENANT_BACKEND:
        raise ValueError(
            f"--radix-cache-backend {backend!r} is not allowed: sglang-iso serves only with "
            f"{TENANT_BACKEND!r}. Use `python -m sglang.launch_server` for an unhardened server."
        )

    if ours.iso_cpu_defaults == "auto" and not cuda_available:
        for flag, value in CPU_DEFAULTS:
            if has_flag(sglang_argv, flag):
                continue
            extra = [flag] if value is None else [flag, value]
            sglang_argv += extra
            added += extra
    return LaunchPlan(sglang_argv=sglang_argv, added=added, dry_run=ours.iso_dry_run)


def has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None
