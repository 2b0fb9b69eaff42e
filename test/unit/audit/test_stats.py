from __future__ import annotations

import random

import pytest

from sglang_iso.audit.client import Timing
from sglang_iso.audit.method import Scope, ScopeSamples
from sglang_iso.audit.stats import analyse


def _samples(hit: list[float], miss: list[float], cached: int | None = None) -> ScopeSamples:
    s = ScopeSamples(Scope("other-tenant", "a", "b"))
    s.attacker = [Timing(x, 100, cached) for x in hit]
    s.miss = [Timing(x, 100, 0 if cached is not None else None) for x in miss]
    return s


def test_faster_attacker_is_detected_direction_is_one_sided() -> None:
    rng = random.Random(0)
    fast = [0.01 + rng.random() * 0.01 for _ in range(30)]
    slow = [0.05 + rng.random() * 0.01 for _ in range(30)]
    hit = analyse(_samples(fast, slow, cached=99), alpha=0.01)
    assert hit.detected and hit.p_value < 1e-10 and hit.verdict == "sharing detected"
    assert hit.oracle is not None and hit.oracle.detected and hit.oracle.attacker_cached_median == 99
    # An attacker *slower* than misses is not cache sharing: the test is one-sided.
    slower = analyse(_samples(slow, fast), alpha=0.01)
    assert not slower.detected and slower.p_value > 0.5
    assert slower.oracle is None


def test_same_distribution_is_not_detected() -> None:
    rng = random.Random(1)
    same = analyse(_samples([rng.gauss(1, 0.1) for _ in range(50)], [rng.gauss(1, 0.1) for _ in range(50)], 0), 0.01)
    assert not same.detected
    assert same.oracle is not None and not same.oracle.detected


def test_too_few_samples_or_bad_alpha() -> None:
    with pytest.raises(ValueError, match="need >= 2"):
        analyse(_samples([0.1], [0.2]), 0.01)
    with pytest.raises(ValueError, match="alpha"):
        analyse(_samples([0.1, 0.2], [0.2, 0.3]), 1.5)
