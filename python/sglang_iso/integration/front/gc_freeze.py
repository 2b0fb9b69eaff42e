"""SGLang's post-start garbage-collector freeze, let through the tenant gate.

Once the server is up, SGLang posts ``/freeze_gc`` to itself: the tokenizer manager,
the scheduler and the detokenizer move their start-up objects out of the collector's
reach (``gc.freeze``), so later full collections scan only what requests allocated.
The call carries SGLang's own API key, which a server behind the gate does not have;
refused with 401, it left every process collecting its whole start-up heap (about
750k objects in the HTTP process here): each such full collection stalls the event
loop for most of a second, which showed as P99 time-to-first-token twice upstream's.
This hook makes the same call with the gate's in-memory ``internal_key``
(:data:`~sglang_iso.server.gate.INTERNAL_PATHS`), once the server accepts connections
(with ``--skip-server-warmup``, which the launcher adds with a tenants file, SGLang
calls before uvicorn listens).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sglang_iso.integration.front import state

logger = logging.getLogger(__name__)

FREEZE_TIMEOUT_S = 10.0
"""How long the freeze call may take (SGLang's own call waits as long)."""
LISTEN_WAIT_S = 120.0
"""How long to wait for the HTTP server to accept connections: with ``--skip-server-warmup`` (which the launcher
adds with a tenants file) SGLang makes its call without waiting for the server to listen."""


def freeze_gc_through_gate(original: Callable[..., Any], server_args: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``http_server._freeze_gc_after_server_warmup``: post ``/freeze_gc`` with the gate's internal key.

    Without the gate (no tenants file) SGLang's own call runs unchanged. A failed call is logged, as SGLang logs
    its own: the server serves either way, with longer collector pauses.
    """
    front = state.current()
    if front is None or front.internal_key is None:
        return original(server_args, *args, **kwargs)
    import requests
    from sglang.srt.arg_groups.serving_hook import ssl_verify_of

    url = server_args.url() + "/freeze_gc"
    headers = {"Authorization": f"Bearer {front.internal_key}"}
    verify = ssl_verify_of(server_args)
    deadline = time.monotonic() + LISTEN_WAIT_S
    while True:  # bounded: until the deadline
        try:
            response = requests.post(url, headers=headers, timeout=FREEZE_TIMEOUT_S, verify=verify)
            response.raise_for_status()
            break
        except requests.exceptions.ConnectionError as exc:
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            return _failed(exc)
        except requests.exceptions.RequestException as exc:
            return _failed(exc)
    logger.info("sglang-iso: garbage collector frozen after start (tokenizer manager, scheduler, detokenizer)")
    return None


def _failed(exc: Exception) -> None:
    logger.warning("sglang-iso: post-start freeze_gc failed (%s); full garbage collections will pause longer", exc)
