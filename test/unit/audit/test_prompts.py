from __future__ import annotations

import pytest

from sglang_iso.audit.prompts import PromptFactory, initial_words


def test_prompts_are_fresh_and_have_the_word_count() -> None:
    f = PromptFactory(seed=0, salt="s", words=12)
    prompts = [f.new() for _ in range(200)]
    assert len({p.split()[0] for p in prompts}) == 200
    assert all(len(p.split()) == 12 for p in prompts)


def test_salt_changes_prompts_seed_reproduces_them() -> None:
    a = PromptFactory(seed=1, salt="x").new()
    assert a == PromptFactory(seed=1, salt="x").new()
    assert a != PromptFactory(seed=1, salt="y").new()


def test_calibrate_scales_words_to_target() -> None:
    f = PromptFactory(seed=0, salt="s", words=initial_words(1500))
    assert f.words == 375
    assert f.calibrate(1500, measured_tokens=2250, measured_words=375) == 250
    with pytest.raises(ValueError, match="positive"):
        f.calibrate(1500, measured_tokens=0, measured_words=375)
