"""sglang-iso's launcher flags and the SGLang defaults it selects.

The launcher accepts every SGLang server flag unchanged. It adds its own flags in
an ``sglang-iso`` argument group, and fills in SGLang flags only where the user
did not set them: ``--radix-cache-backend tenant`` always, and on a machine
without CUDA the CPU settings that serve (``--device cpu``, ``--attention-backend
torch_native``, ``--disable-cuda-graph``; with LoRA on, ``--lora-backend torch_native``) and a KV pool
sized for the model's context and the running requests (``server/cpu_pool.py``) unless the user sized it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from sglang_iso import coverage
from sglang_iso.constants import BACKEND_NAME as TENANT_BACKEND
from sglang_iso.server.argv import flag_value, has_flag
from sglang_iso.server.cpu_pool import local_model_config

# (flag, value or None for a switch): SGLang flags the CPU default set adds.
CPU_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--disable-cuda-graph", None),
)
SWA_LAYOUT_FLAG = coverage.SWA_LAYOUT_FLAG
"""Added unless given: SGLang's one-pool layout for hybrid SWA models."""
# Added on CPU only when LoRA is on (--enable-lora or --lora-paths).
CPU_LORA_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--lora-backend", "torch_native"),  # NOTE: the default csgmv backend needs a CUDA device name
)


class LaunchPlan(NamedTuple):
    """What the launcher will run."""

    sglang_argv: list[str]  # passed unchanged to SGLang's own parser
    added: list[str]  # the defaults sglang-iso filled in (for the startup log)
    dry_run: bool
    tenants_file: str | None  # absolute path, validated by the caller
    kv_scrub: str  # "on-free" or "off"
    audit_log: str | None  # absolute path
    kv_owner_check: str  # "on" or "off"
    metrics_auth: str = "admin"  # "admin" (the /metrics endpoint needs the admin key) or "open"
    env_added: tuple[tuple[str, str], ...] = ()  # environment defaults for the server (name, value)


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
        "--iso-swa-layout",
        choices=["one-pool", "sub-pool"],
        default="one-pool",
        help="Hybrid sliding-window models: one-pool keeps every layer's KV in one pool (default; adds "
        f"{coverage.SWA_LAYOUT_FLAG}); sub-pool serves SGLang's SWA sub-pool layout (less memory; refused on "
        "torch_native).",
    )
    group.add_argument(
        "--tenants-file",
        default=None,
        metavar="PATH",
        help="TOML file of tenants, keys and cache policies; enables per-tenant authentication and isolation.",
    )
    group.add_argument(
        "--kv-scrub",
        choices=["on-free", "off"],
        default="on-free",
        help="on-free: zero every freed KV page before it is handed out again (default); off: never.",
    )
    group.add_argument(
        "--kv-owner-check",
        choices=["on", "off"],
        default="on",
        help="on: before every forward, whatever the attention backend, check each KV page a request's row "
        "points at is its own; a foreign or free page reads as zeros and aborts the request (default). "
        "Refused with speculative decoding other than NGRAM, STANDALONE, EAGLE, EAGLE3 and NEXTN, --dllm-algorithm and "
        "--disaggregation-mode decode.",
    )
    group.add_argument(
        "--iso-audit-log",
        default=None,
        metavar="PATH",
        help="JSON-lines audit log (size-rotated): cache hits, auth failures, admin actions; violations go to "
        "PATH.scheduler. No prompt text.",
    )
    group.add_argument(
        "--iso-metrics-auth",
        choices=["admin", "open"],
        default="admin",
        help="admin: with --tenants-file, /metrics needs the admin key (Prometheus scrapes with a bearer token; "
        "default); open: /metrics needs no key, as in upstream SGLang (it names every tenant).",
    )
    group.add_argument(
        "--iso-l3-max-gb",
        type=_l3_max_gb,
        default=None,
        metavar="GIB",
        help="With --hicache-storage-backend file: most GiB of page files the L3 store keeps (default 64); over "
        "it the least recently used files of any tenant are deleted. Per-tenant caps: l3_quota_tokens.",
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


def plan_launch(argv: Sequence[str], *, cuda_available: bool, env: dict[str, str] | None = None) -> LaunchPlan:
    """Split ``argv`` into our flags and SGLang's, and add the defaults.

    Raises:
        ValueError: a feature the coverage table refuses (:mod:`sglang_iso.coverage`: another
            ``--radix-cache-backend``, a flag or environment variable that would bypass the tenant gate,
            an uncovered PD, HiCache or speculative setup), or ``--iso-l3-max-gb`` without L3.
    """
    ours, rest = iso_parser().parse_known_args(list(argv))
    sglang_argv = list(rest)
    added: list[str] = []
    env_added: list[tuple[str, str]] = []
    features = coverage.Features.from_argv(
        sglang_argv,
        env or {},
        kv_owner_check=ours.kv_owner_check == "on",
        tenants_file=ours.tenants_file is not None,
        model_config=local_model_config(sglang_argv),
        cuda_available=cuda_available,
    )
    refused = coverage.refusals(features)
    if refused:
        raise ValueError(coverage.explain(refused))

    if flag_value(sglang_argv, "--radix-cache-backend") is None:
        sglang_argv += ["--radix-cache-backend", TENANT_BACKEND]
        added += ["--radix-cache-backend", TENANT_BACKEND]
    if ours.iso_swa_layout == "one-pool" and not has_flag(sglang_argv, SWA_LAYOUT_FLAG):
        # NOTE: hybrid SWA models then keep every layer's KV in one pool (the window is an attention mask), the
        # layout the tenant tree covers; SGLang's SWA sub-pool layout is refused. A no-op for other models.
        sglang_argv.append(SWA_LAYOUT_FLAG)
        added.append(SWA_LAYOUT_FLAG)

    if features.hybrid_ssm and not has_flag(sglang_argv, coverage.MAMBA_STRATEGY_FLAG):
        # NOTE: the state cache strategy the hybrid tree covers (SGLang's "auto" may pick the extra buffer).
        sglang_argv += [coverage.MAMBA_STRATEGY_FLAG, coverage.MAMBA_STRATEGY]
        added += [coverage.MAMBA_STRATEGY_FLAG, coverage.MAMBA_STRATEGY]

    if ours.iso_cpu_defaults == "auto" and not cuda_available:
        lora_on = has_flag(sglang_argv, "--enable-lora") or has_flag(sglang_argv, "--lora-paths")
        for flag, value in CPU_DEFAULTS + (CPU_LORA_DEFAULTS if lora_on else ()):
            if has_flag(sglang_argv, flag):
                continue
            extra = [flag] if value is None else [flag, value]
            sglang_argv += extra
            added += extra
        from sglang_iso.server.cpu_pool import cpu_pool_flags

        pool = cpu_pool_flags(sglang_argv)  # NOTE: SGLang's memory-based CPU pool is tens of millions of slots
        sglang_argv += pool
        added += pool
        env_added += _cpu_bind_default(sglang_argv, env or {})
    from sglang_iso.server.pd_args import pd_defaults

    pd_added = pd_defaults(sglang_argv, cuda_available=cuda_available)
    sglang_argv += pd_added
    added += pd_added
    from sglang_iso.server.hicache_args import plan_hicache

    sglang_argv, hicache_added, hicache_env = plan_hicache(
        sglang_argv,
        cuda_available=cuda_available,
        tenants_file=ours.tenants_file,
        env=env or {},
        max_gb=ours.iso_l3_max_gb,
    )
    added += hicache_added
    env_added += hicache_env
    if ours.tenants_file is not None and not has_flag(sglang_argv, "--skip-server-warmup"):
        # NOTE: SGLang's warmup requests carry no tenant key, so the gate would refuse them.
        sglang_argv.append("--skip-server-warmup")
        added.append("--skip-server-warmup")
    return LaunchPlan(
        sglang_argv=sglang_argv,
        added=added,
        dry_run=ours.iso_dry_run,
        tenants_file=str(Path(ours.tenants_file).resolve()) if ours.tenants_file else None,
        kv_scrub=ours.kv_scrub,
        audit_log=str(Path(ours.iso_audit_log).resolve()) if ours.iso_audit_log else None,
        kv_owner_check=ours.kv_owner_check,
        metrics_auth=ours.iso_metrics_auth,
        env_added=tuple(env_added),
    )


def _cpu_bind_default(argv: Sequence[str], env: dict[str, str]) -> list[tuple[str, str]]:
    """NOTE: SGLang on CPU needs a thread binding per rank once there is more than one rank."""
    import os

    from sglang_iso.server.dp import CPU_BIND_ENV, cpu_threads_bind, world_size

    if env.get(CPU_BIND_ENV):
        return []
    bind = cpu_threads_bind(world_size(argv), os.sched_getaffinity(0))
    return [] if bind is None else [(CPU_BIND_ENV, bind)]


def _l3_max_gb(text: str) -> float:
    from sglang_iso.server.hicache_args import l3_max_gb

    return l3_max_gb(text)
