"""Launcher rules for the hierarchical cache (``--enable-hierarchical-cache``) with the tenant cache.

The host tier (L2) and L3 file store are the tenant cache's own
(:mod:`sglang_iso.integration.host_cache`), so SGLang's storage backends must
never run: ``--hicache-storage-backend file`` is taken out of SGLang's
arguments and handed to the scheduler as :data:`L3_DIR_ENV` (the directory:
upstream's ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``, else ``/tmp/hicache``).
Other backends are refused, and so is L3 without ``--tenants-file`` (its
namespace secret keys the store): rows of :mod:`sglang_iso.coverage`. ``--iso-l3-max-gb`` (default 64) caps the
store's page files; the oldest go first (:mod:`sglang_iso.integration.l3_store`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from sglang_iso import envvars
from sglang_iso.server.argv import flag_value, has_flag, without_flag

L3_DIR_ENV = envvars.L3_DIR.name
"""Set by the launcher, read by the scheduler's cache factory: the L3 file store's directory."""
L3_MAX_BYTES_ENV = envvars.L3_MAX_BYTES.name
"""Set by the launcher (``--iso-l3-max-gb``), read by the cache factory: the L3 store's overall cap in bytes."""
DEFAULT_L3_MAX_GB = 64.0
"""Overall L3 cap without ``--iso-l3-max-gb`` (GiB of page files per server)."""
UPSTREAM_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
DEFAULT_DIR = "/tmp/hicache"
STORAGE_FLAG = "--hicache-storage-backend"
# NOTE: layer_first / direct keep SGLang from preparing page-first transfer staging for a host pool that the
# tenant cache never builds (it keeps its own host buffers).
CPU_HICACHE_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("--hicache-io-backend", "direct"),
    ("--hicache-mem-layout", "layer_first"),
)


def l3_max_gb(text: str) -> float:
    """``--iso-l3-max-gb`` value: a positive number of GiB.

    Raises:
        argparse.ArgumentTypeError: not a positive finite number.
    """
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of GiB, got {text!r}")
    return value


def plan_hicache(
    argv: Sequence[str],
    *,
    cuda_available: bool,
    tenants_file: str | None,
    env: dict[str, str],
    max_gb: float | None = None,
) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Returns (SGLang argv, flags added, environment added). ``max_gb``: ``--iso-l3-max-gb`` if given.

    The storage setups it does not serve were refused before, by the coverage table (:mod:`sglang_iso.coverage`).

    Raises:
        ValueError: ``--iso-l3-max-gb`` without L3.
    """
    out = list(argv)
    added: list[str] = []
    env_added: list[tuple[str, str]] = []
    enabled = has_flag(out, "--enable-hierarchical-cache")
    backend = flag_value(out, STORAGE_FLAG)
    if backend is not None:
        # NOTE: the coverage table refused every other backend, and file without HiCache or a tenants file.
        out = without_flag(out, STORAGE_FLAG)
        directory = env.get(UPSTREAM_DIR_ENV) or DEFAULT_DIR
        env_added.append((L3_DIR_ENV, str(Path(directory).resolve())))
        env_added.append((L3_MAX_BYTES_ENV, str(int((max_gb or DEFAULT_L3_MAX_GB) * (1 << 30)))))
    elif max_gb is not None:
        raise ValueError(f"--iso-l3-max-gb needs {STORAGE_FLAG} file")
    if enabled and not cuda_available:
        for flag, value in CPU_HICACHE_DEFAULTS:
            if not has_flag(out, flag):
                out += [flag, value]
                added += [flag, value]
    return out, added, env_added
