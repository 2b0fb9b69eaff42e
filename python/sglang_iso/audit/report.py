"""Audit output: a Markdown table, a JSON file with every sample, and a PNG of the latency distributions."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from .method import SCOPES, ScopeSamples
from .stats import ScopeResult

TABLE_HEADER = (
    "| scope | n attacker | n miss | median attacker ms | median miss ms | KS D | p-value | verdict "
    "| cached_tokens oracle |\n|---|---|---|---|---|---|---|---|---|"
)


def table(results: list[ScopeResult]) -> str:
    """One Markdown row per scope."""
    rows = [TABLE_HEADER]
    for r in results:
        rows.append(
            f"| {r.scope} | {r.n_attacker} | {r.n_miss} | {r.median_attacker_s * 1e3:.1f} | "
            f"{r.median_miss_s * 1e3:.1f} | {r.ks_statistic:.2f} | {r.p_value:.3g} | "
            f"{r.verdict} (alpha {r.alpha:g}) | {oracle_text(r)} |"
        )
    return "\n".join(rows)


def oracle_text(r: ScopeResult) -> str:
    o = r.oracle
    if o is None:
        return "not reported"
    of = f" of {o.prompt_tokens_median:.0f}" if o.prompt_tokens_median is not None else ""
    verdict = "reveals sharing" if o.detected else "no sharing"
    return f"median {o.attacker_cached_median:.0f}{of} (misses <= {o.miss_cached_max}): {verdict}"


def to_json(config: dict[str, Any], results: list[ScopeResult], samples: list[ScopeSamples]) -> dict[str, Any]:
    """Everything needed to re-analyse the run: the config (keys left out), verdicts and raw samples."""
    return {
        "config": config,
        "results": [asdict(r) | {"verdict": r.verdict} for r in results],
        "samples": {
            s.scope.name: {
                "attacker": [asdict(t) for t in s.attacker],
                "miss": [asdict(t) for t in s.miss],
            }
            for s in samples
        },
    }


def write_plot(path: Path, results: list[ScopeResult], samples: list[ScopeSamples], title: str) -> bool:
    """Empirical CDFs of attacker vs miss latency per scope (what the KS test compares).

    Returns False (and writes nothing) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return False
    by_scope = {s.scope.name: s for s in samples}
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        s = by_scope[r.scope]
        for label, timings, color in (("attacker (victim's prompt)", s.attacker, "C3"), ("certain miss", s.miss, "C0")):
            xs = sorted(t.latency_s * 1e3 for t in timings)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=label, color=color)
        ax.set_title(f"{r.scope}: p={r.p_value:.2g} ({r.verdict})", fontsize=10)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor log labels overlap on a narrow axis
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("empirical CDF")
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def scope_help() -> str:
    return "; ".join(f"{name}: {text}" for name, text in SCOPES.items())
