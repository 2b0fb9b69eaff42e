"""The sampling procedure of Gu et al., "Auditing Prompt Caching in Language Model APIs" (ICML 2025).

For each sample and each scope (one round over all scopes per sample, so slow drift hits every scope alike)::

    victim:    P_i  x victim_repeats        (untimed: puts P_i in the cache, if the server caches it)
    attacker:  P_i  -> hit-candidate timing  } in random order, so that drift and
    attacker:  M_i  -> guaranteed-miss timing } warm-up effects cancel between the two
                                               (M_i: fresh random prompt, same length)

Every P_i and M_i is a new prompt: the attacker's own request caches P_i for the attacker, so a prompt is
never timed twice. The two timing lists then go to the KS test (:mod:`.stats`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .client import Client, Timing
from .prompts import PromptFactory

SCOPES: dict[str, str] = {
    "same-key": "the attacker uses the victim's own key (positive control: a caching server must show a hit)",
    "same-tenant": "the attacker uses another key of the victim's tenant (--same-tenant-key)",
    "other-tenant": "the attacker uses another tenant's key (--attacker-key); must not show a hit",
}
"""Scope name -> what it tests, in report order (the ``--scopes`` choices)."""


@dataclass(frozen=True)
class Scope:
    """Who sends the victim prompt and who times it."""

    name: str
    """One of :data:`SCOPES`."""
    victim_key: str | None
    """API key of the victim (None: no Authorization header)."""
    attacker_key: str | None
    """API key of the attacker (None: no Authorization header)."""


@dataclass
class ScopeSamples:
    """Timings collected for one scope; appended to by :func:`collect` only."""

    scope: Scope
    attacker: list[Timing] = field(default_factory=list)
    """The attacker's timing of a prompt the victim just sent (possible hit)."""
    miss: list[Timing] = field(default_factory=list)
    """The attacker's timing of a fresh prompt (certain miss)."""


def collect(
    client: Client,
    scopes: list[Scope],
    prompts: PromptFactory,
    *,
    samples: int,
    victim_repeats: int,
    rng: random.Random,
    deadline: float,
    progress: Callable[[str], None] = lambda _msg: None,
    clock: Callable[[], float] = time.monotonic,
) -> list[ScopeSamples]:
    """Collect up to ``samples`` hit-candidate and miss timings per scope.

    Stops early (with equal counts per scope and kind) when ``clock()`` passes ``deadline``.

    Raises:
        AuditRequestError: a request failed.
        ValueError: ``samples`` or ``victim_repeats`` below 1, or no scope.
    """
    if samples < 1 or victim_repeats < 1 or not scopes:
        raise ValueError(f"need samples >= 1, victim_repeats >= 1 and a scope; got {samples=} {victim_repeats=}")
    out = [ScopeSamples(scope) for scope in scopes]
    report_every = max(1, samples // 5)
    for i in range(samples):
        if clock() > deadline:
            progress(f"time limit reached after {i} of {samples} samples per scope")
            break
        for acc in out:
            _one_sample(client, acc, prompts, victim_repeats, rng)
        if (i + 1) % report_every == 0 or i + 1 == samples:
            progress(f"{i + 1}/{samples} samples per scope")
    return out


def _one_sample(
    client: Client, acc: ScopeSamples, prompts: PromptFactory, victim_repeats: int, rng: random.Random
) -> None:
    victim_prompt = prompts.new()
    for _ in range(victim_repeats):
        client.measure(acc.scope.victim_key, victim_prompt)
    miss_prompt = prompts.new()
    attacker = acc.scope.attacker_key
    if rng.random() < 0.5:
        hit_timing = client.measure(attacker, victim_prompt)
        miss_timing = client.measure(attacker, miss_prompt)
    else:
        miss_timing = client.measure(attacker, miss_prompt)
        hit_timing = client.measure(attacker, victim_prompt)
    acc.attacker.append(hit_timing)
    acc.miss.append(miss_timing)
