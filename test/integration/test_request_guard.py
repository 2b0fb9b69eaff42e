"""The scheduler's token-id check refuses exactly what the id-by-id rule refuses, None items included."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_iso.integration.request_guard import input_ids_problem

VOCAB = 2048


def id_by_id(ids: list[Any], vocab: int) -> bool:
    """The rule, one id at a time: every id an integer (an int, a bool, a numpy integer: what ``operator.index``
    takes, as SGLang's embedding does) in range."""
    return all(isinstance(t, int | np.integer) and 0 <= int(t) < vocab for t in ids)


ids_like = st.lists(
    st.one_of(
        st.integers(-3, VOCAB + 3),
        st.booleans(),
        st.floats(allow_nan=True),
        st.text(max_size=2),
        st.none(),
        st.integers(-3, VOCAB + 3).map(np.int64),
        st.integers(0, 255).map(np.uint8),
        st.integers(-(2**70), 2**70),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(ids_like)
def test_the_check_refuses_exactly_what_the_id_by_id_rule_refuses(ids: list[Any]) -> None:
    assert (input_ids_problem(ids, VOCAB) is None) == id_by_id(ids, VOCAB), ids


def test_a_prompt_in_the_vocabulary_passes_and_one_id_outside_is_named() -> None:
    prompt = list(range(VOCAB)) * 2
    assert input_ids_problem(prompt, VOCAB) is None  # positive control: the whole vocabulary, twice
    for bad in (VOCAB, -1, 10**30, 1.0, "7"):
        problem = input_ids_problem([*prompt[:500], bad, *prompt[500:]], VOCAB)
        assert problem is not None and repr(bad) in problem, (bad, problem)
    assert input_ids_problem([], VOCAB) == "the prompt is empty"
    assert input_ids_problem(5, VOCAB) == "input_ids is not a sequence"
    assert input_ids_problem([VOCAB + 5], None) is None  # no vocabulary known: only the shape is checked
