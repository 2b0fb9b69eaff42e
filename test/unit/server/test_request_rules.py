"""The gate's body rules: every crasher refused with a 400 naming the field; clean bodies pass; never raises."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_iso.server.request_rules import (
    MAX_JSON_DEPTH,
    MAX_TOP_LOGPROBS,
    Checked,
    Limits,
    Refusal,
    check_body,
)

LIMITS = Limits(vocab_size=2048, context_len=8192)


def check(obj: Any, tenant: str = "acme") -> Checked | Refusal:
    return check_body(json.dumps(obj).encode(), tenant, LIMITS)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_ids": [5, 2048]}, "input_ids"),
        ({"input_ids": [-1]}, "input_ids"),
        ({"input_ids": [[1, 2], [3, 9999]]}, "input_ids"),
        ({"input_ids": [1.5]}, "input_ids"),
        ({"input_ids": [1, True]}, "input_ids"),  # a bool is not a token id (an int subclass in Python)
        ({"input_ids": [[1, 2], [3, False]]}, "input_ids"),
        ({"input_ids": [1, "2"]}, "input_ids"),
        ({"tokens": [70000]}, "tokens"),
        ({"prompt": [1, 2, 4096]}, "prompt"),
        ({"messages": [], "top_logprobs": 5000, "logprobs": True}, "top_logprobs"),
        ({"prompt": "x", "logprobs": 5000}, "logprobs"),
        ({"text": "x", "top_logprobs_num": 3000}, "top_logprobs_num"),
        ({"text": "x", "logprob_start_len": -5}, "logprob_start_len"),
        ({"text": "x", "custom_labels": {"foo": "bar"}}, "custom_labels"),
        ({"messages": [], "n": 100000}, "n"),
        ({"text": "x", "sampling_params": {"max_new_tokens": 10**12}}, "sampling_params.max_new_tokens"),
        ({"text": "x", "sampling_params": {"stop_token_ids": [99999]}}, "sampling_params.stop_token_ids"),
        ({"messages": [], "logit_bias": {"99999": 1.0}}, "logit_bias"),
        ({"text": "x", "rid": 5}, "rid"),
        ({"text": ""}, "text"),
        ({"text": ["a", ""]}, "text"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [[1], []]}, "input_ids"),
        ({"prompt": ""}, "prompt"),
        ({"text": "x", "sampling_params": [{}]}, "sampling_params"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
        ({"text": "x", "rid": ["a"]}, "rid"),
        ({"text": "x", "sampling_params": 5}, "sampling_params"),
        ({"input": "x", "request_id": "a" * 1000}, "request_id"),
    ],
)
def test_crashers_are_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    out = check(body)
    assert isinstance(out, Refusal) and out.status == 400 and out.field == field, out


@pytest.mark.parametrize(
    "body",
    [
        {"input_ids": [0, 5, 2047]},
        {"prompt": [[1, 2], [3]]},
        {"prompt": ["a", "b"]},
        {"messages": [], "logprobs": True, "top_logprobs": MAX_TOP_LOGPROBS},
        {"text": "x", "logprob_start_len": -1, "top_logprobs_num": 5},
        {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 8}, {"max_new_tokens": 8.0}]},
        {"text": "a", "return_logprob": True, "token_ids_logprob": [1, 2]},
        {"input_ids": [[1], [2]], "token_ids_logprob": [[1], [2]]},
    ],
)
def test_legitimate_bodies_pass_unchanged(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    out = check_body(raw, "acme", LIMITS)
    assert isinstance(out, Checked) and out.body == raw, out


def test_request_ids_move_into_the_tenants_id_space() -> None:
    out = check({"input": "x", "request_id": "alpha"}, tenant="beta")
    assert isinstance(out, Checked) and json.loads(out.body)["request_id"] == "beta.alpha"
    out = check({"text": ["a", "b"], "rid": ["alpha.job1", ""]}, tenant="beta")
    assert isinstance(out, Checked) and json.loads(out.body)["rid"] == ["beta.alpha.job1", "beta."]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)
fields = st.sampled_from(
    ["text", "input_ids", "rid", "request_id", "top_logprobs", "logprobs", "n", "sampling_params", "prompt",
     "tokens", "logprob_start_len", "logit_bias", "max_tokens", "top_logprobs_num"]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(fields, json_values, max_size=5), st.sampled_from(["acme", "beta"]))
def test_never_raises_and_never_forwards_a_foreign_rid(body: dict[str, Any], tenant: str) -> None:
    out = check(body, tenant)
    if isinstance(out, Refusal):
        assert 400 <= out.status < 500
        return
    forwarded = json.loads(out.body)
    for field in ("rid", "request_id"):
        value = forwarded.get(field)
        if value is not None:
            for rid in value if isinstance(value, list) else [value]:
                assert rid.startswith(tenant + "."), forwarded


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(raw: bytes) -> None:
    out = check_body(raw, "acme", LIMITS)
    assert isinstance(out, Refusal) or out.body == raw


@pytest.mark.parametrize("where", ["among_ids", "sampling_params", "top"])
def test_depth_counts_containers_wherever_they_nest(where: str) -> None:
    """Nesting past ``MAX_JSON_DEPTH`` is refused whether it sits among token ids, in an object or at the top;
    the same body one level shallower passes the depth rule (and is refused, if at all, for something else)."""

    def nested(levels: int) -> Any:
        value: Any = [1, 2]
        for _ in range(levels - 1):
            value = [3, value, 4]
        return value

    def body(levels: int) -> dict[str, Any]:
        if where == "among_ids":
            return {"text": "x", "extra": [5] * 100 + [nested(levels - 2)]}
        if where == "sampling_params":
            return {"text": "x", "sampling_params": {"max_new_tokens": 4, "regex": nested(levels - 2)}}
        return {"text": "x", "top": nested(levels - 1)}

    too_deep = check(body(MAX_JSON_DEPTH + 1))
    assert isinstance(too_deep, Refusal) and too_deep.code == "invalid_json" and "deeper" in too_deep.message
    at_limit = check(body(MAX_JSON_DEPTH))
    assert not (isinstance(at_limit, Refusal) and "deeper" in at_limit.message), at_limit


def test_checked_body_hands_back_the_object_it_forwards() -> None:
    raw = json.dumps({"text": "x", "rid": "job1", "input_ids": None}).encode()
    out = check_body(raw, "acme", LIMITS)
    assert not isinstance(out, Refusal)
    assert json.loads(out.body) == out.obj and out.obj["rid"] == "acme.job1"  # the object is the forwarded one
    empty = check_body(b"  ", "acme", LIMITS)
    assert not isinstance(empty, Refusal) and empty.obj is None and empty.body == b"  "


@pytest.mark.parametrize(
    "raw",
    [
        b'{"text": "x\\ud800y"}',  # a lone surrogate: stdlib json builds a str, SGLang's parser refuses it
        b'\xef\xbb\xbf{"text": "x"}',  # a UTF-8 byte order mark
        b'{"text": "x", "temperature": NaN}',
        b'{"text": "x"} {"text": "y"}',
    ],
)
def test_a_body_sglangs_parser_refuses_is_refused_here_not_forwarded(raw: bytes) -> None:
    """The rules judge the object SGLang's own parser (orjson, its ``ORJSONRequest``) builds: a body only the
    standard library would read is a 400 here, never forwarded for SGLang to read otherwise; the same prompt in
    plain JSON passes."""
    import orjson

    out = check_body(raw, "acme", LIMITS)
    assert isinstance(out, Refusal) and (out.status, out.code) == (400, "invalid_json"), out
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    clean = check_body(b'{"text": "xy", "temperature": 0.5}', "acme", LIMITS)
    assert isinstance(clean, Checked) and clean.obj == orjson.loads(clean.body)


def test_a_huge_integer_is_judged_as_the_float_sglang_reads() -> None:
    """orjson reads an integer past 64 bits as a float, as SGLang will: a token id that large is refused as not an
    integer, a budget that large as out of range; the same fields with small values pass."""
    huge = "1" + "0" * 30
    ids = check_body(f'{{"input_ids": [5, {huge}]}}'.encode(), "acme", LIMITS)
    assert isinstance(ids, Refusal) and ids.field == "input_ids", ids
    budget = check_body(f'{{"text": "x", "sampling_params": {{"max_new_tokens": {huge}}}}}'.encode(), "acme", LIMITS)
    assert isinstance(budget, Refusal) and budget.field == "sampling_params.max_new_tokens", budget
    fine = check_body(b'{"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 8}}', "acme", LIMITS)
    assert isinstance(fine, Checked)
