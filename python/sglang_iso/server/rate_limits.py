"""Per-tenant rate limits: requests per minute and tokens per minute, as refilling buckets.

Each limited tenant has a bucket per limit that holds at most ``limit`` units and refills at ``limit / 60`` units
per second, so a tenant may burst up to its minute's worth and then runs at the limit's rate (OpenAI's model:
``x-ratelimit-reset-*`` is the time until the bucket is full again). A request takes one request unit and a token
reservation: its prompt tokens (counted by the server's tokenizer, or estimated from bytes without one) plus the
output budget it asks for (``max_new_tokens`` / ``max_tokens`` / ``max_completion_tokens``, times ``n``;
:data:`DEFAULT_OUTPUT_ESTIMATE` when it names none). When the response ends, :meth:`RateLimiter.settle` replaces the
reservation with the tokens the server reported (``usage`` or ``meta_info``); a request that generated more than it
reserved leaves the bucket below zero, and the tenant waits until the debt is refilled.

Buckets are keyed by tenant id and outlive a tenants-file reload: a tenant whose limits did not change keeps its
counters; a changed limit keeps the bucket's level, clamped to the new size. Limits are enforced by each HTTP
server (one per worker; a data-parallel server is one): behind a router over N workers a tenant can get up to N
times its limit, so an operator divides the limit by N.

Single event loop: touched only from the HTTP server's loop, so no lock is needed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

SECONDS_PER_MINUTE = 60.0
DEFAULT_OUTPUT_ESTIMATE = 128
"""Output tokens reserved for a request that names no budget (SGLang's own ``max_new_tokens`` default); the real
count replaces it when the response ends."""
BYTES_PER_TOKEN_ESTIMATE = 4
"""Prompt bytes per token when no tokenizer is at hand (a reservation only; the real count settles it)."""
BUDGET_FIELDS = ("max_new_tokens", "max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True)
class RateLimits:
    """One tenant's limits; ``None`` = not limited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    """Prompt plus output tokens per minute."""

    @property
    def any(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


class Bucket:
    """Units available to one tenant for one limit: at most ``size``, refilled at ``size / 60`` per second.

    ``level`` may go below zero (settled debt); mutated only through :meth:`take`, :meth:`give` and :meth:`resize`.
    """

    def __init__(self, size: int, now: float) -> None:
        self.size = size
        self.level = float(size)
        self._at = now

    @property
    def rate(self) -> float:
        """Units refilled per second."""
        return self.size / SECONDS_PER_MINUTE

    def refill(self, now: float) -> None:
        self.level = min(float(self.size), self.level + max(0.0, now - self._at) * self.rate)
        self._at = max(self._at, now)

    def wait_for(self, units: float) -> float:
        """Seconds until ``units`` are available (0 when they are); call after :meth:`refill`."""
        return max(0.0, (units - self.level) / self.rate)

    def take(self, units: float) -> None:
        self.level -= units

    def give(self, units: float) -> None:
        self.level = min(float(self.size), self.level + units)

    def resize(self, size: int) -> None:
        self.size = size
        self.level = min(self.level, float(size))

    def until_full(self) -> float:
        return max(0.0, (self.size - self.level) / self.rate)


class Verdict(NamedTuple):
    """What :meth:`RateLimiter.admit` decided for one request."""

    admitted: bool
    limit: str | None
    """``"requests"`` or ``"tokens"``: the limit that refused it; ``None`` when admitted."""
    retry_after_s: float
    """Seconds until the request would fit (0 when admitted; ``math.inf`` when it never can)."""
    reserved_tokens: int
    """Tokens taken from the tenant's bucket (0 when refused or not limited)."""


class RateLimiter:
    """Buckets per tenant, with the limits looked up per request (so a reload takes effect for the next one)."""

    def __init__(self, limits_of: Callable[[str], RateLimits], clock: Callable[[], float] = time.monotonic) -> None:
        self._limits_of = limits_of
        self._clock = clock
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}
        self.refused: dict[str, int] = {}
        """Tenant -> requests refused by a rate limit."""

    def limits(self, tenant: str) -> RateLimits:
        return self._limits_of(tenant)

    def admit(self, tenant: str, tokens: int) -> Verdict:
        """Take one request and ``tokens`` from ``tenant``'s buckets, or neither (refused, counted)."""
        limits = self._limits_of(tenant)
        now = self._clock()
        requests = _bucket(self._requests, tenant, limits.requests_per_minute, now)
        token_bucket = _bucket(self._tokens, tenant, limits.tokens_per_minute, now)
        if requests is not None and requests.level < 1:
            return self._refuse(tenant, "requests", requests.wait_for(1))
        if token_bucket is not None:
            if tokens > token_bucket.size:
                return self._refuse(tenant, "tokens", math.inf)
            if token_bucket.level < tokens:
                return self._refuse(tenant, "tokens", token_bucket.wait_for(tokens))
            token_bucket.take(tokens)
        if requests is not None:
            requests.take(1)
        return Verdict(True, None, 0.0, tokens if token_bucket is not None else 0)

    def undo(self, tenant: str, verdict: Verdict) -> None:
        """Give back what an admitted request took (it was refused later, before SGLang saw it)."""
        if not verdict.admitted:
            return
        if (requests := self._requests.get(tenant)) is not None:
            requests.give(1)
        if verdict.reserved_tokens and (tokens := self._tokens.get(tenant)) is not None:
            tokens.give(verdict.reserved_tokens)

    def settle(self, tenant: str, reserved: int, used: int | None) -> None:
        """The response ended: replace the reservation by the ``used`` tokens (``None``: keep the reservation)."""
        bucket = self._tokens.get(tenant)
        if bucket is None or used is None or used == reserved:
            return
        bucket.refill(self._clock())
        if used > reserved:
            bucket.take(used - reserved)
        else:
            bucket.give(reserved - used)

    def headers(self, tenant: str) -> list[tuple[bytes, bytes]]:
        """OpenAI's ``x-ratelimit-*`` headers for ``tenant``'s limits (none for a limit it does not have)."""
        limits = self._limits_of(tenant)
        now = self._clock()
        out: list[tuple[bytes, bytes]] = []
        for name, size, buckets in (
            ("requests", limits.requests_per_minute, self._requests),
            ("tokens", limits.tokens_per_minute, self._tokens),
        ):
            bucket = _bucket(buckets, tenant, size, now)
            if bucket is None:
                continue
            out += [
                (f"x-ratelimit-limit-{name}".encode(), str(bucket.size).encode()),
                (f"x-ratelimit-remaining-{name}".encode(), str(max(0, math.floor(bucket.level))).encode()),
                (f"x-ratelimit-reset-{name}".encode(), format_duration(bucket.until_full()).encode()),
            ]
        return out

    def state(self, tenant: str) -> dict[str, float]:
        """Levels of ``tenant``'s buckets, for the admin API (``remaining_requests``, ``remaining_tokens``)."""
        out: dict[str, float] = {}
        now = self._clock()
        for name, buckets in (("requests", self._requests), ("tokens", self._tokens)):
            bucket = buckets.get(tenant)
            if bucket is not None:
                bucket.refill(now)
                out[f"remaining_{name}"] = round(bucket.level, 1)
        return out

    def _refuse(self, tenant: str, limit: str, wait_s: float) -> Verdict:
        self.refused[tenant] = self.refused.get(tenant, 0) + 1
        return Verdict(False, limit, wait_s, 0)


def _bucket(buckets: dict[str, Bucket], tenant: str, size: int | None, now: float) -> Bucket | None:
    """``tenant``'s bucket for a limit of ``size`` (refilled to ``now``), made or resized as needed; None: no limit."""
    if size is None:
        buckets.pop(tenant, None)
        return None
    bucket = buckets.get(tenant)
    if bucket is None:
        bucket = buckets[tenant] = Bucket(size, now)
    bucket.refill(now)
    if bucket.size != size:
        bucket.resize(size)
    return bucket


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: ``"250ms"``, ``"1.5s"``, ``"6m0s"``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < SECONDS_PER_MINUTE:
        return f"{math.ceil(seconds * 10) / 10:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"


def reservation(body: dict[str, Any], count: Callable[[str], int] | None) -> int:
    """Tokens to reserve for one request body: its prompt tokens plus its output budget (module doc)."""
    prompt = sum(_prompt_tokens(value, count) for value in _prompt_values(body))
    params = body.get("sampling_params")
    if isinstance(params, list):  # NOTE: a batch's per-prompt parameters: the first stands for all (settled later)
        params = next((p for p in params if isinstance(p, dict)), None)
    sources = [body, params] if isinstance(params, dict) else [body]
    budget = DEFAULT_OUTPUT_ESTIMATE
    for source in sources:
        for name in BUDGET_FIELDS:
            value = source.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                budget = value
    samples = 1
    for source in sources:
        n = source.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n > 1:
            samples = n
    return prompt + budget * samples * max(1, _batch_size(body))


def budget_field(body: dict[str, Any]) -> str:
    """The field that sets ``body``'s output budget (to name in an error), ``max_tokens`` when it sets none."""
    params = body.get("sampling_params")
    if isinstance(params, dict):
        for name in BUDGET_FIELDS:
            if name in params:
                return f"sampling_params.{name}"
    return next((name for name in BUDGET_FIELDS if name in body), "max_tokens")


def used_tokens(payloads: Iterable[Any]) -> int | None:
    """Prompt plus output tokens a response reported, from its JSON payloads; ``None`` when none reported any.

    OpenAI responses carry ``usage``; SGLang's ``/generate`` carries ``meta_info`` per sample (cumulative in a
    stream, so the last payload of each sample id counts).
    """
    usage: int | None = None
    per_sample: dict[str, int] = {}
    for payload in payloads:
        for item in payload if isinstance(payload, list) else [payload]:
            if not isinstance(item, dict):
                continue
            found = item.get("usage")
            if isinstance(found, dict):
                total = _int(found.get("prompt_tokens")) + _int(found.get("completion_tokens"))
                usage = total or _int(found.get("total_tokens")) or usage
            meta = item.get("meta_info")
            if isinstance(meta, dict) and "completion_tokens" in meta:
                sample = str(meta.get("id", item.get("index", len(per_sample))))
                per_sample[sample] = _int(meta.get("prompt_tokens")) + _int(meta.get("completion_tokens"))
    if usage is not None:
        return usage
    return sum(per_sample.values()) if per_sample else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _prompt_values(body: dict[str, Any]) -> list[object]:
    return [body[name] for name in ("text", "prompt", "input", "input_ids", "messages") if name in body]


def _prompt_tokens(value: object, count: Callable[[str], int] | None) -> int:
    """Tokens in a prompt value: token ids count one each, strings are counted (or estimated), containers summed."""
    if isinstance(value, str):
        if count is not None:
            try:
                return count(value)
            except Exception:  # NOTE: a tokenizer error must not refuse the request: fall back to the estimate
                pass
        return math.ceil(len(value.encode()) / BYTES_PER_TOKEN_ESTIMATE)
    if isinstance(value, int) and not isinstance(value, bool):
        return 1
    if isinstance(value, list):
        return sum(_prompt_tokens(v, count) for v in value)
    if isinstance(value, dict):
        return sum(_prompt_tokens(value[k], count) for k in ("content", "text") if k in value)
    return 0


def _batch_size(body: dict[str, Any]) -> int:
    """Prompts in one request: a list of strings or of id lists is a batch (each sample has its own budget)."""
    for name in ("text", "prompt", "input_ids"):
        value = body.get(name)
        if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
            return len(value)
    return 1
