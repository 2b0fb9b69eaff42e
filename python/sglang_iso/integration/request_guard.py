"""Second line of the request plane, in the scheduler: one bad request is aborted alone.

The HTTP gate refuses the request values known to crash SGLang, but requests can
reach the scheduler by paths that skip the gate (in-process ``Engine``, an
``open``-mode server without a tenants file). AROUND
``Scheduler.handle_generate_request``:

* the request's token ids are checked (non-empty, inside the vocabulary) before
  SGLang builds a ``Req``: an out-of-vocabulary id would otherwise raise inside
  the model's embedding during a batched forward and stop the scheduler for
  every tenant;
* on a prefill/decode worker, a generation request that names no transfer
  (``bootstrap_host``/``bootstrap_room``) is refused: SGLang's PD scheduler would stop on it;
* any exception raised while SGLang admits the request is caught.

Either way the request is answered with an abort (HTTP 400 and the reason) through
SGLang's own abort path, the event is logged, and the scheduler keeps serving.

NOTE: errors raised later, inside a batched model forward or in the tokenizer
manager's shared output loop, cannot be confined to one request: a forward runs
the whole batch at once and the output loop serves every request. Those are
prevented up front (the gate's rules, the check above).
"""

from __future__ import annotations

import logging
import operator
from array import array
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


_NO_BAD_ID = object()
"""The id search's answer when every id is good (None cannot be: a prompt may hold None itself)."""


def input_ids_problem(input_ids: Any, vocab_size: int | None) -> str | None:
    """Why ``input_ids`` cannot be run, or None. Never raises.

    An id is an integer (an ``int``, a ``bool``, a numpy integer: anything ``operator.index`` takes) inside the
    vocabulary; anything else is named in the answer.
    """
    if input_ids is None:
        return None
    try:
        ids = input_ids if type(input_ids) is list else list(input_ids)
    except TypeError:
        return "input_ids is not a sequence"
    if not ids:
        return "the prompt is empty"
    if vocab_size is not None:
        try:
            # NOTE: the common case in one C pass (the ids packed as int64) and two reductions: a prompt of ~1,400
            # ids cost 107 us of scheduler thread CPU as three passes over its Python ints (types, min, max).
            packed = np.frombuffer(array("q", ids), dtype=np.int64)
        except (TypeError, OverflowError, ValueError):
            packed = None  # (an item that is no integer, or one past int64: searched below)
        if packed is not None and int(packed.min()) >= 0 and int(packed.max()) < vocab_size:
            return None
        bad = next((t for t in ids if not _in_vocabulary(t, vocab_size)), _NO_BAD_ID)
        if bad is not _NO_BAD_ID:
            return f"token id {bad!r} is outside the vocabulary [0, {vocab_size})"
    return None


def _in_vocabulary(token: Any, vocab_size: int) -> bool:
    try:
        value = operator.index(token)
    except TypeError:
        return False
    return 0 <= value < vocab_size


def bootstrap_problem(server_args: Any, recv_req: Any) -> str | None:
    """Why a request cannot run on this prefill/decode worker (no transfer named), or None. Never raises."""
    from sglang_iso.server.pd_rules import pd_role

    role = pd_role(
        getattr(server_args, "disaggregation_mode", None), getattr(server_args, "disaggregation_transfer_backend", None)
    )
    if role is None or not role.needs_bootstrap or type(recv_req).__name__ != "TokenizedGenerateReqInput":
        return None
    if getattr(recv_req, "bootstrap_host", None) is None or getattr(recv_req, "bootstrap_room", None) is None:
        # NOTE: SGLang's PD scheduler stops on such a request instead of refusing it.
        return f"a {role.mode} worker needs bootstrap_host and bootstrap_room (send requests through the PD router)"
    return None


def guard_generate_request(original: Any, scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``Scheduler.handle_generate_request``: validate, and abort this request alone on error."""
    vocab = getattr(getattr(scheduler, "model_config", None), "vocab_size", None)
    problem = None
    if getattr(recv_req, "input_embeds", None) is None:
        problem = input_ids_problem(getattr(recv_req, "input_ids", None), vocab if isinstance(vocab, int) else None)
    if problem is None:
        problem = bootstrap_problem(getattr(scheduler, "server_args", None), recv_req)
    if problem is None:
        try:
            return original(scheduler, recv_req, *args, **kwargs)
        except Exception as exc:  # NOTE: one request's admission error must not stop the scheduler
            logger.exception("sglang-iso: request %s failed admission; aborted alone", getattr(recv_req, "rid", None))
            problem = f"the request could not be admitted ({type(exc).__name__})"
    _abort(scheduler, recv_req, problem)
    return None


def _abort(scheduler: Any, recv_req: Any, message: str) -> None:
    from sglang.srt.managers.io_struct import AbortReq

    rid = getattr(recv_req, "rid", None)
    logger.warning("sglang-iso: request %s refused in the scheduler: %s", rid, message)
    abort = AbortReq(
        rid=rid,
        abort_message=message,
        finished_reason={"type": "abort", "status_code": 400, "message": message},
    )
    scheduler.send_abort_output(abort, recv_req)
