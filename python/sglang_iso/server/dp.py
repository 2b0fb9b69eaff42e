"""Data parallel serving: which rank a tenant's requests go to, and CPU thread binding per rank.

Each DP rank is a scheduler process with its own tenant tree, scrubber and
owner table. Prefix reuse only happens inside one rank, so a tenant (or a cache
group, which shares one namespace owner) is pinned to one stable rank: the same
owner always lands on the same rank while the rank count is unchanged. Routing
decides *where* a request runs, never *what it may reuse*: every rank isolates
tenants on its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

CPU_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
_DOMAIN = b"sglang-iso/dp-rank/v1\x00"
_SIZE_FLAGS = {
    "dp": ("--dp-size", "--data-parallel-size"),
    "tp": ("--tp-size", "--tensor-parallel-size"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
}


def tenant_rank(owner: str, dp_size: int) -> int:
    """The DP rank in ``[0, dp_size)`` for namespace owner ``owner`` (stable across processes and restarts).

    Raises:
        ValueError: ``dp_size`` < 1.
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    digest = hashlib.sha256(_DOMAIN + owner.encode()).digest()
    return int.from_bytes(digest[:8], "big") % dp_size


def world_size(argv: Sequence[str]) -> int:
    """dp x tp x pp from SGLang flags (1 for each not given).

    Raises:
        ValueError: a size flag is not a positive integer.
    """
    from sglang_iso.server.argv import flag_value

    total = 1
    for names in _SIZE_FLAGS.values():
        text = next((v for v in (flag_value(argv, n) for n in names) if v is not None), "1")
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{names[0]} must be a positive integer, got {text!r}")
        total *= int(text)
    return total


def cpu_threads_bind(ranks: int, cpus: Iterable[int]) -> str | None:
    """A ``SGLANG_CPU_OMP_THREADS_BIND`` value giving each of ``ranks`` ranks its own contiguous share of
    ``cpus`` (ranks share cores round-robin when there are fewer cores than ranks); None for one rank."""
    cores = sorted(set(cpus))
    if ranks <= 1 or not cores:
        return None
    if len(cores) < ranks:
        groups = [[cores[i % len(cores)]] for i in range(ranks)]
    else:
        per, extra = divmod(len(cores), ranks)
        groups, start = [], 0
        for i in range(ranks):
            size = per + (1 if i < extra else 0)
            groups.append(cores[start : start + size])
            start += size
    return "|".join(_cpu_list(g) for g in groups)


def _cpu_list(cores: list[int]) -> str:
    if cores == list(range(cores[0], cores[-1] + 1)):
        return str(cores[0]) if len(cores) == 1 else f"{cores[0]}-{cores[-1]}"
    return ",".join(str(c) for c in cores)
