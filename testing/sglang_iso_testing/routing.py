"""sglang-router in front of sglang-iso workers: command line and readiness.

With ``--policy manual`` the router sends requests carrying the same ``x-smg-routing-key`` header to
the same worker. A gateway that sets this header to the authenticated tenant id gives each tenant
cache affinity; it decides *where* a request runs, never *what it may reuse*: every worker still
authenticates the key and namespaces the cache by tenant (examples/README.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from sglang_iso_testing.process import free_port, request_json

ROUTING_KEY_HEADER = "x-smg-routing-key"
"""Header read by the router's ``manual`` policy: same value, same worker."""


def router_argv(port: int, worker_urls: Sequence[str], *extra: str, policy: str = "manual") -> list[str]:
    """Command line for sglang-router on 127.0.0.1:``port`` (metrics on another free loopback port).

    Runs through ``sglang-iso router``, which applies the CPU shims first (the plain
    ``python -m sglang_router.launch_router`` crashes on a CPU-only torch install).
    """
    if not worker_urls:
        raise ValueError("router_argv needs at least one worker URL")
    return [
        sys.executable,
        "-m",
        "sglang_iso.cli",
        "router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        policy,
        # NOTE: the router's Prometheus endpoint listens on 0.0.0.0:29000 unless told otherwise.
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        *extra,
    ]


def wait_for_workers(router_url: str, count: int, *, timeout_s: float = 120.0) -> list[dict[str, object]]:
    """Wait until the router lists ``count`` healthy workers; returns its worker list.

    The router answers /health before it has registered its workers, so readiness is read from
    ``GET /workers``.

    Raises:
        TimeoutError: fewer than ``count`` healthy workers after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    workers: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        try:
            status, body = request_json(router_url + "/workers", None, timeout_s=10)
        except OSError:
            status, body = 0, None
        if status == 200 and isinstance(body, dict):
            workers = list(body.get("workers", []))
            if sum(1 for w in workers if w.get("is_healthy")) >= count:
                return workers
        time.sleep(0.5)
    raise TimeoutError(f"router {router_url} has {workers!r}, wanted {count} healthy workers after {timeout_s:.0f}s")
