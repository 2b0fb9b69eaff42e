"""``sglang-iso audit`` / ``python -m sglang_iso.audit``: the prompt-cache sharing audit against a live server.

Exit codes: 0 the audit ran (whatever the verdicts), 1 a request failed or too few samples were collected,
2 bad arguments, 3 ``--fail-on-cross-tenant`` and the other-tenant scope showed sharing (timing or oracle).
"""

from __future__ import annotations

import argparse
import random
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sglang_iso import envvars

from .client import APIS, TIMINGS, AuditRequestError, make_client
from .method import SCOPES, Scope, ScopeSamples, collect
from .prompts import PromptFactory, initial_words
from .report import scope_help, table, to_json, write_plot
from .stats import ScopeResult, analyse

DEFAULT_BASE_URL = "http://127.0.0.1:30000"


@dataclass(frozen=True)
class AuditConfig:
    """One audit run; the CLI options, field by field."""

    base_url: str = DEFAULT_BASE_URL
    victim_key: str | None = None
    attacker_key: str | None = None
    """Key of another tenant (scope other-tenant); None on an open server (then: another anonymous client)."""
    same_tenant_key: str | None = None
    """A second key of the victim's tenant (scope same-tenant); the scope is skipped without it."""
    api: str = "openai"
    timing: str = "ttft"
    model: str = "default"
    samples: int = 30
    """Hit-candidate samples per scope; as many certain misses."""
    prompt_tokens: int = 1500
    """Approximate prompt length in tokens (calibrated against the server's ``prompt_tokens``)."""
    victim_repeats: int = 2
    alpha: float = 0.01
    scopes: tuple[str, ...] = ()
    """Scopes to run; empty: every scope the keys allow."""
    seed: int = 0
    salt: str = field(default_factory=lambda: secrets.token_hex(8))
    """Mixed into the prompt seed so a rerun never meets an earlier run's cache entries."""
    request_timeout_s: float = 120.0
    max_seconds: float = 3600.0
    """Sampling stops (with what it has) after this long."""


@dataclass(frozen=True)
class AuditReport:
    config: AuditConfig
    results: list[ScopeResult]
    samples: list[ScopeSamples]
    prompt_words: int

    def result(self, scope: str) -> ScopeResult:
        for r in self.results:
            if r.scope == scope:
                return r
        raise KeyError(f"no result for scope {scope!r}; have {[r.scope for r in self.results]}")


def plan_scopes(config: AuditConfig) -> list[Scope]:
    """The scopes to run, in :data:`SCOPES` order.

    Raises:
        ValueError: an unknown scope, a requested scope the keys do not allow, or an attacker key equal to
            the victim's.
    """
    if config.attacker_key and config.attacker_key == config.victim_key:
        raise ValueError("--attacker-key equals --victim-key: other-tenant needs another tenant's key")
    possible = {
        "same-key": Scope("same-key", config.victim_key, config.victim_key),
        "same-tenant": Scope("same-tenant", config.victim_key, config.same_tenant_key)
        if config.same_tenant_key
        else None,
        "other-tenant": Scope("other-tenant", config.victim_key, config.attacker_key)
        if config.attacker_key or not config.victim_key
        else None,
    }
    unknown = sorted(set(config.scopes) - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scopes {unknown}; choose from {list(SCOPES)}")
    wanted = list(config.scopes) or list(SCOPES)
    missing = [s for s in config.scopes if possible[s] is None]
    if missing:
        raise ValueError(
            f"scopes {missing} need keys: same-tenant needs --same-tenant-key, other-tenant --attacker-key"
        )
    return [scope for name in SCOPES if name in wanted and (scope := possible[name]) is not None]


def run_audit(config: AuditConfig, *, log: Callable[[str], None] = lambda _m: None) -> AuditReport:
    """Calibrate the prompt length, collect the samples and test each scope.

    Raises:
        ValueError: bad configuration (see :func:`plan_scopes`), or fewer than 2 samples collected.
        AuditRequestError: a request failed.
    """
    scopes = plan_scopes(config)
    client = make_client(
        config.api, config.base_url, timing=config.timing, model=config.model, timeout_s=config.request_timeout_s
    )
    prompts = PromptFactory(config.seed, config.salt, initial_words(config.prompt_tokens))
    words = prompts.words
    probe = client.measure(config.victim_key, prompts.new())
    if probe.prompt_tokens:
        probe_words = words
        words = prompts.calibrate(config.prompt_tokens, probe.prompt_tokens, probe_words)
        log(f"calibrated: {words} words per prompt (a {probe_words} word probe had {probe.prompt_tokens} tokens)")
    else:
        log(f"the server reports no prompt_tokens: using {words} words per prompt uncalibrated")
    for _ in range(2):  # warm-up: the first requests after start or idle are slower
        client.measure(config.attacker_key if config.attacker_key else config.victim_key, prompts.new())
    log(f"scopes: {', '.join(s.name for s in scopes)}; {config.samples} samples each")
    samples = collect(
        client,
        scopes,
        prompts,
        samples=config.samples,
        victim_repeats=config.victim_repeats,
        rng=random.Random(config.seed),
        deadline=time.monotonic() + config.max_seconds,
        progress=log,
    )
    results = [analyse(s, config.alpha) for s in samples]
    return AuditReport(config, results, samples, prompts.words)


def write_outputs(report: AuditReport, out_dir: Path) -> list[Path]:
    """Write ``audit.md``, ``audit.json`` and (with matplotlib) ``audit.png`` into ``out_dir``."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    c = report.config
    public = {
        "base_url": c.base_url,
        "api": c.api,
        "timing": c.timing,
        "samples": c.samples,
        "prompt_tokens": c.prompt_tokens,
        "prompt_words": report.prompt_words,
        "victim_repeats": c.victim_repeats,
        "alpha": c.alpha,
        "seed": c.seed,
        "keys": {
            "victim": bool(c.victim_key),
            "attacker": bool(c.attacker_key),
            "same_tenant": bool(c.same_tenant_key),
        },
    }
    written = [out_dir / "audit.md", out_dir / "audit.json"]
    written[0].write_text(f"# Prompt-cache audit of {c.base_url} ({c.api}, {c.timing})\n\n{table(report.results)}\n")
    written[1].write_text(json.dumps(to_json(public, report.results, report.samples), indent=1))
    title = f"{c.base_url} api={c.api} timing={c.timing} ~{c.prompt_tokens} prompt tokens"
    if write_plot(out_dir / "audit.png", report.results, report.samples, title):
        written.append(out_dir / "audit.png")
    return written


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sglang-iso audit",
        description="Detect prompt-cache sharing between API keys by timing (Gu et al., ICML 2025): a victim key "
        "caches a prompt, an attacker key times the same prompt, a one-sided two-sample KS test compares those "
        "timings with certain misses. Scopes: " + scope_help(),
    )
    p.add_argument("--base-url", default=DEFAULT_BASE_URL, help="server root (default %(default)s)")
    p.add_argument(
        "--victim-key",
        default=envvars.AUDIT_VICTIM_KEY.get(),
        help="API key of the victim (or $SGLANG_ISO_AUDIT_VICTIM_KEY; omit for a server without keys)",
    )
    p.add_argument(
        "--attacker-key",
        default=envvars.AUDIT_ATTACKER_KEY.get(),
        help="API key of another tenant, scope other-tenant (or $SGLANG_ISO_AUDIT_ATTACKER_KEY)",
    )
    p.add_argument(
        "--same-tenant-key",
        default=envvars.AUDIT_SAME_TENANT_KEY.get(),
        help="a second key of the victim's tenant, scope same-tenant (or $SGLANG_ISO_AUDIT_SAME_TENANT_KEY)",
    )
    p.add_argument("--api", choices=sorted(APIS), default="openai", help="openai: /v1/completions; sglang: /generate")
    p.add_argument(
        "--timing", choices=list(TIMINGS), default="ttft", help="; ".join(f"{k}: {v}" for k, v in TIMINGS.items())
    )
    p.add_argument("--model", default="default", help="model field of OpenAI requests (default %(default)s)")
    p.add_argument(
        "--samples", type=int, default=30, help="hit-candidate samples per scope, as many misses (default %(default)s)"
    )
    p.add_argument("--prompt-tokens", type=int, default=1500, help="approximate prompt length (default %(default)s)")
    p.add_argument(
        "--victim-repeats", type=int, default=2, help="times the victim sends each prompt (default %(default)s)"
    )
    p.add_argument("--alpha", type=float, default=0.01, help="significance level (default %(default)s)")
    p.add_argument(
        "--scopes", default="", help=f"comma-separated subset of {','.join(SCOPES)} (default: all the keys allow)"
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path("sglang-iso-audit"),
        help="where audit.md/.json/.png go (default %(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seeds the measurement order and prompts (plus fresh per-run salt)"
    )
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request (default %(default)s)")
    p.add_argument(
        "--max-minutes", type=float, default=60.0, help="stop sampling after this long (default %(default)s)"
    )
    p.add_argument("--fail-on-cross-tenant", action="store_true", help="exit 3 if the other-tenant scope shows sharing")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the table")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.samples < 2 or args.prompt_tokens < 8 or args.victim_repeats < 1 or not 0 < args.alpha < 1:
        parser.error("need --samples >= 2, --prompt-tokens >= 8, --victim-repeats >= 1 and 0 < --alpha < 1")
    config = AuditConfig(
        base_url=args.base_url,
        victim_key=args.victim_key,
        attacker_key=args.attacker_key,
        same_tenant_key=args.same_tenant_key,
        api=args.api,
        timing=args.timing,
        model=args.model,
        samples=args.samples,
        prompt_tokens=args.prompt_tokens,
        victim_repeats=args.victim_repeats,
        alpha=args.alpha,
        scopes=tuple(s for s in args.scopes.split(",") if s),
        seed=args.seed,
        request_timeout_s=args.request_timeout,
        max_seconds=args.max_minutes * 60.0,
    )
    try:
        plan_scopes(config)
    except ValueError as e:
        parser.error(str(e))
    log: Callable[[str], None] = (lambda _m: None) if args.quiet else (lambda m: print(f"audit: {m}", file=sys.stderr))
    try:
        report = run_audit(config, log=log)
    except (AuditRequestError, ValueError) as e:
        print(f"sglang-iso audit: {e}", file=sys.stderr)
        return 1
    print(table(report.results))
    for path in write_outputs(report, args.out_dir):
        log(f"wrote {path}")
    if args.fail_on_cross_tenant:
        cross = [r for r in report.results if r.scope == "other-tenant"]
        if any(r.detected or (r.oracle is not None and r.oracle.detected) for r in cross):
            return 3
    return 0
