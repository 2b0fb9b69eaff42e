"""The statistics of the audit: a one-sided two-sample Kolmogorov-Smirnov test per scope, and the oracle.

``ks_2samp(attacker, miss, alternative="greater")``: the alternative is that the attacker's latency CDF lies
above the miss CDF somewhere, i.e. the attacker's requests are faster (they hit a cache). A p-value below
``alpha`` means the server shares the victim's cache entries with the attacker.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from scipy.stats import ks_2samp

from .client import Timing
from .method import ScopeSamples


@dataclass(frozen=True)
class OracleResult:
    """What the responses' ``cached_tokens`` field says (the oracle side channel)."""

    attacker_cached_median: float
    """Median cached tokens reported to the attacker for the victim's prompts."""
    attacker_cached_max: int
    miss_cached_max: int
    """Largest cached-token count on a certain miss (chance prefixes of a token or two)."""
    prompt_tokens_median: float | None
    detected: bool
    """True when the attacker's median exceeds every miss: the field itself reveals the victim's prompt."""


@dataclass(frozen=True)
class ScopeResult:
    """The verdict for one scope."""

    scope: str
    n_attacker: int
    n_miss: int
    median_attacker_s: float
    median_miss_s: float
    ks_statistic: float
    p_value: float
    alpha: float
    detected: bool
    """p_value < alpha: the attacker's timings are significantly faster than certain misses."""
    oracle: OracleResult | None
    """None when the server reported no ``cached_tokens`` (e.g. OpenAI API without ``--enable-cache-report``)."""

    @property
    def verdict(self) -> str:
        return "sharing detected" if self.detected else "no sharing detected"


def analyse(samples: ScopeSamples, alpha: float) -> ScopeResult:
    """KS test and oracle for one scope.

    Raises:
        ValueError: fewer than 2 samples of either kind, or alpha outside (0, 1).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    hit = [t.latency_s for t in samples.attacker]
    miss = [t.latency_s for t in samples.miss]
    if len(hit) < 2 or len(miss) < 2:
        raise ValueError(f"scope {samples.scope.name}: need >= 2 samples of each kind, got {len(hit)} and {len(miss)}")
    test = ks_2samp(hit, miss, alternative="greater")
    p_value = float(test.pvalue)
    return ScopeResult(
        scope=samples.scope.name,
        n_attacker=len(hit),
        n_miss=len(miss),
        median_attacker_s=statistics.median(hit),
        median_miss_s=statistics.median(miss),
        ks_statistic=float(test.statistic),
        p_value=p_value,
        alpha=alpha,
        detected=p_value < alpha,
        oracle=_oracle(samples.attacker, samples.miss),
    )


def _oracle(attacker: list[Timing], miss: list[Timing]) -> OracleResult | None:
    hit_cached = [t.cached_tokens for t in attacker if t.cached_tokens is not None]
    miss_cached = [t.cached_tokens for t in miss if t.cached_tokens is not None]
    if not hit_cached or not miss_cached:
        return None
    prompt_tokens = [t.prompt_tokens for t in attacker if t.prompt_tokens is not None]
    median = float(statistics.median(hit_cached))
    return OracleResult(
        attacker_cached_median=median,
        attacker_cached_max=max(hit_cached),
        miss_cached_max=max(miss_cached),
        prompt_tokens_median=float(statistics.median(prompt_tokens)) if prompt_tokens else None,
        detected=median > max(miss_cached),
    )
