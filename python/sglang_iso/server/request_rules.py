"""What a tenant's request body may contain: the gate's body rules (no SGLang import).

:func:`check_body` takes the raw body of a tenant request and returns either the
body to forward (with request ids moved into the tenant's own id space) or a
:class:`Refusal` naming the field. The rules, each there because one bad value
could crash the server for every tenant or reach another tenant:

* the body is one JSON object, at most ``MAX_JSON_DEPTH`` deep, without NaN or
  Infinity, parsed by the parser SGLang parses it with (orjson), so the rules judge
  exactly the object SGLang will serve;
* fields that address other tenants' cache entries, sessions or routing are
  refused (``FORBIDDEN_FIELDS``);
* request ids (``rid``, ``request_id``) are prefixed ``<tenant>.`` so that no
  tenant's id can equal, prefix or probe another's; SGLang's own ids (uuid hex,
  no dot) cannot collide with them either;
* prompts are not empty; token ids lie in the vocabulary; logprob counts, ``n``
  and token budgets are bounded (``Limits``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from sglang_iso.server.pd_rules import BOOTSTRAP_FIELDS, PdRole, check_bootstrap

MAX_JSON_DEPTH = 32
"""Nesting depth of arrays and objects a body may have (chat messages with tool calls need about 8)."""
MAX_TOP_LOGPROBS = 20
"""Largest top-logprobs count per token (OpenAI's limit)."""
MAX_N = 16
"""Largest number of choices per request (``n``, ``best_of``)."""
MAX_RID_CHARS = 256
"""Longest request id a tenant may send (before the tenant prefix)."""

# Body fields a tenant may not send, and why (README lists them).
FORBIDDEN_FIELDS: dict[str, str] = {
    "extra_key": "the cache namespace is set by the server",
    "mm_hashes": "multimodal hashes key shared caches",
    "kv_hints": "KV placement hints address cache entries",
    "session_params": "sessions splice other requests' tokens",
    "routed_dp_rank": "routing is decided by the server",
    "data_parallel_rank": "routing is decided by the server",
    "bootstrap_host": "disaggregation transfer is server-internal",
    "bootstrap_port": "disaggregation transfer is server-internal",
    "bootstrap_room": "disaggregation transfer is server-internal",
    "bootstrap_pair_key": "disaggregation transfer is server-internal",
    "custom_logit_processor": "server-side code execution is not offered to tenants",
    "previous_response_id": "stored responses are not partitioned by tenant",
    "custom_labels": "metric labels are set by the server",
}
# Fields holding request ids (abort, duplicate detection and disconnect handling key on them).
RID_FIELDS = ("rid", "request_id")
# Fields holding token ids, at the top level of the body.
TOKEN_ID_FIELDS = ("input_ids", "tokens", "token_ids_logprob", "stop_token_ids")
# Prompt fields: an empty prompt (or batch item) crashes SGLang's scheduler (zero-length forward).
PROMPT_FIELDS = ("text", "input_ids", "prompt", "input")
# /generate fields that are per prompt in a batch: a list only for a batch, and then one item per prompt.
PER_PROMPT_FIELDS = (
    "sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
    "lora_path",
)  # fmt: skip
# Fields with a top-logprobs count (native, chat, completions).
TOP_LOGPROB_FIELDS = ("top_logprobs_num", "top_logprobs", "logprobs")
# Token budgets, bounded by the model's context length.
TOKEN_BUDGET_FIELDS = ("max_new_tokens", "min_new_tokens", "max_tokens", "max_completion_tokens", "min_tokens")


@dataclass(frozen=True)
class Limits:
    """Model-dependent bounds, read from the running server."""

    vocab_size: int
    """Token ids must be in ``[0, vocab_size)``."""
    context_len: int
    """Token budgets may not exceed the model's context length."""


class Refusal(NamedTuple):
    """Why a body is refused: HTTP status, error code, the offending field (or None) and a message."""

    status: int
    code: str
    field: str | None
    message: str


class Checked(NamedTuple):
    """A body that passed the rules: the bytes to forward, and the JSON object they hold (None for an empty body)."""

    body: bytes
    obj: dict[str, Any] | None


def check_body(
    body: bytes,
    tenant: str,
    limits: Limits | None,
    *,
    path: str = "",
    pd: PdRole | None = None,
    from_router: bool = False,
) -> Checked | Refusal:
    """The body to forward for ``tenant`` with the JSON object it holds (later checks need not parse it again),
    or the reason to refuse it. Never raises.

    ``pd`` is this worker's prefill/decode role (None: not disaggregated); ``from_router`` marks a body the PD
    router forwards for ``tenant``: it may carry the bootstrap fields, and its request ids are already in the
    tenant's id space (:mod:`sglang_iso.server.pd_rules`).
    """
    if not body.strip():
        return Checked(body, None)
    try:
        # NOTE: SGLang's own parser (its ORJSONRequest): no parser differential between what is checked and what
        # is served (stdlib json accepts lone surrogates and a BOM, which SGLang then refuses); NaN and Infinity
        # are not JSON to it; and it costs a fifth of stdlib json on a prompt of token ids.
        obj = orjson.loads(body)
    except (ValueError, RecursionError):
        return Refusal(400, "invalid_json", None, "The request body is not valid JSON.")
    if not isinstance(obj, dict):
        return Refusal(400, "invalid_json", None, f"The request body must be a JSON object, not {_kind(obj)}.")
    if _depth(obj) > MAX_JSON_DEPTH:
        return Refusal(400, "invalid_json", None, f"The request body is nested deeper than {MAX_JSON_DEPTH} levels.")
    for field, why in FORBIDDEN_FIELDS.items():
        if obj.get(field) is not None and not (from_router and field in BOOTSTRAP_FIELDS):
            return Refusal(400, "forbidden_field", field, f"Field {field!r} is not allowed: {why}.")
    refusal = _check_values(obj, limits) or _check_batch_shape(obj)
    if refusal is not None:
        return refusal
    pd_refusal = check_bootstrap(obj, pd, path, from_router=from_router)
    if pd_refusal is not None:
        return _bad(pd_refusal.field, pd_refusal.reason)
    if from_router:
        # NOTE: the gate resolved ``tenant`` from these very ids (router_tenant), so they are already prefixed.
        return Checked(body, obj)
    changed = False
    for field in RID_FIELDS:
        value = obj.get(field)
        if value is None:
            continue
        prefixed = _prefix_rid(value, tenant)
        if prefixed is None:
            return Refusal(
                400, "invalid_field", field, f"Field {field!r} must be a string (or a list of strings) of at most "
                f"{MAX_RID_CHARS} characters.",
            )  # fmt: skip
        obj[field] = prefixed
        changed = True
    return Checked(orjson.dumps(obj) if changed else body, obj)


def _kind(obj: object) -> str:
    return {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(obj), "null"
    )


def _depth(obj: object) -> int:
    """Nesting depth of arrays/objects (iterative: a deep body must not exhaust the stack here)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        # NOTE: only containers go on the stack, and a prompt of token ids is looked at in C, not a tuple per id.
        kinds = set(map(type, children))
        if dict in kinds or list in kinds:
            stack.extend((child, depth + 1) for child in children if type(child) in _CONTAINERS)
    return deepest


_CONTAINERS = (dict, list)  # what orjson.loads builds that can nest


def _prefix_rid(value: object, tenant: str) -> str | list[str] | None:
    if isinstance(value, str) and len(value) <= MAX_RID_CHARS:
        return f"{tenant}.{value}"
    if isinstance(value, list) and value and all(isinstance(r, str) and len(r) <= MAX_RID_CHARS for r in value):
        return [f"{tenant}.{r}" for r in value]
    return None


def _check_values(obj: dict[str, Any], limits: Limits | None) -> Refusal | None:
    for field in PROMPT_FIELDS:
        value = obj.get(field)
        if value is None:
            continue
        if value in ("", []) or (isinstance(value, list) and _has_empty_item(value)):
            return _bad(field, "must not be empty (nor any item of a batch)")
    params = obj.get("sampling_params")
    scopes: list[tuple[str, dict[str, Any]]] = [("", obj)]
    if isinstance(params, dict):
        scopes.append(("sampling_params.", params))
    elif isinstance(params, list):
        scopes += [(f"sampling_params[{i}].", p) for i, p in enumerate(params) if isinstance(p, dict)]
    for prefix, scope in scopes:
        for check in (_token_ids, _top_logprobs, _counts, _budgets):
            refusal = check(prefix, scope, limits)
            if refusal is not None:
                return refusal
    if limits is not None and isinstance(obj.get("prompt"), list):
        # /v1/completions: a prompt may be token ids (or a batch of them).
        refusal = _ids_in_vocab("prompt", obj["prompt"], limits, allow_text=True)
        if refusal is not None:
            return refusal
    return _logprob_start_len(obj)


def _has_empty_item(items: list[Any]) -> bool:
    """An item is ``""`` or ``[]``. NOTE: the item types first, in C: a prompt of token ids is not compared to
    ``""`` and ``[]`` id by id."""
    kinds = set(map(type, items))
    return (str in kinds and "" in items) or (list in kinds and [] in items)


def _batch_size(obj: dict[str, Any]) -> int | None:
    """Prompts in a /generate batch; None for a single prompt (or no prompt field)."""
    text, ids = obj.get("text"), obj.get("input_ids")
    if isinstance(text, list):
        return len(text)
    if isinstance(ids, list) and ids and all(isinstance(row, list) for row in ids):
        return len(ids)
    return None


def _check_batch_shape(obj: dict[str, Any]) -> Refusal | None:
    if "text" not in obj and "input_ids" not in obj:
        return None
    size = _batch_size(obj)
    for field in PER_PROMPT_FIELDS:
        value = obj.get(field)
        # NOTE: token_ids_logprob is itself a list for one prompt; a batch gives a list of lists.
        is_list = isinstance(value, list) and (field != "token_ids_logprob" or any(isinstance(v, list) for v in value))
        if value is None or not is_list:
            if field == "sampling_params" and value is not None and not isinstance(value, dict | list):
                return _bad(field, "must be an object (or, for a batch, a list of objects)")
            continue
        if size is None:
            return _bad(field, "must not be a list for a single prompt")
        if len(value) != size:
            return _bad(field, f"must have one item per prompt ({size})")
        if field == "sampling_params" and not all(isinstance(v, dict) for v in value):
            return _bad(field, "items must be objects")
    return None


def _token_ids(prefix: str, scope: dict[str, Any], limits: Limits | None) -> Refusal | None:
    if limits is None:
        return None
    for field in TOKEN_ID_FIELDS:
        if scope.get(field) is not None:
            refusal = _ids_in_vocab(prefix + field, scope[field], limits, allow_text=False)
            if refusal is not None:
                return refusal
    bias = scope.get("logit_bias")
    if isinstance(bias, dict):
        for key in bias:
            if not (isinstance(key, str) and key.isdigit() and int(key) < limits.vocab_size):
                return _bad(prefix + "logit_bias", f"keys must be token ids in [0, {limits.vocab_size})")
    return None


def _ids_in_vocab(field: str, value: object, limits: Limits, *, allow_text: bool) -> Refusal | None:
    """``value`` is an id list, or a list of id lists; with ``allow_text``, strings may stand for prompts."""
    rows = value if isinstance(value, list) and value and all(isinstance(v, list) for v in value) else [value]
    for row in rows:
        if allow_text and (isinstance(row, str) or (isinstance(row, list) and all(isinstance(v, str) for v in row))):
            continue
        if not isinstance(row, list):
            return _bad(field, "must be a list of token ids")
        # NOTE: the common case in C: every item exactly an int (a bool is not), all within the vocabulary.
        if row and set(map(type, row)) == _INT_ONLY and min(row) >= 0 and max(row) < limits.vocab_size:
            continue
        for token in row:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < limits.vocab_size:
                return _bad(field, f"token ids must be integers in [0, {limits.vocab_size})")
    return None


_INT_ONLY = {int}


def _top_logprobs(prefix: str, scope: dict[str, Any], _limits: Limits | None) -> Refusal | None:
    for field in TOP_LOGPROB_FIELDS:
        value = scope.get(field)
        if value is None or (field == "logprobs" and isinstance(value, bool)):
            continue  # chat's ``logprobs`` is a switch; completions' is a count
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= MAX_TOP_LOGPROBS:
                return _bad(prefix + field, f"must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    return None


def _counts(prefix: str, scope: dict[str, Any], _limits: Limits | None) -> Refusal | None:
    for field in ("n", "best_of"):
        value = scope.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_N):
            return _bad(prefix + field, f"must be an integer in [1, {MAX_N}]")
    return None


def _budgets(prefix: str, scope: dict[str, Any], limits: Limits | None) -> Refusal | None:
    for field in TOKEN_BUDGET_FIELDS:
        value = scope.get(field)
        if value is None:
            continue
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        upper = limits.context_len if limits is not None else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (upper is not None and value > upper):
            bound = f"[0, {upper}]" if upper is not None else ">= 0"
            return _bad(prefix + field, f"must be an integer in {bound}")
    return None


def _logprob_start_len(obj: dict[str, Any]) -> Refusal | None:
    value = obj.get("logprob_start_len")
    if value is None:
        return None
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) or not isinstance(item, int) or item < -1:
            return _bad("logprob_start_len", "must be -1 (default) or a non-negative integer")
    return None


def _bad(field: str, why: str) -> Refusal:
    return Refusal(400, "invalid_field", field, f"Field {field!r} {why}.")
