"""Prefix-tree micro-benchmark: our ``TenantRadixTree`` against upstream SGLang's trees, same trace, one CPU thread.

Usage::

    python benchmark/tree_ops.py [--ops N] [--seed S] [--impls ours,radix,...] [--plot PATH]

For each config (tenants x page size) one synthetic trace is recorded, then replayed on every implementation:

* request: the tenant's system prompt (2 per tenant, 128-768 tokens), or a continuation of one of its recent
  conversations (25%), plus a random new turn; replayed as ``match`` then ``insert`` (matched slots + fresh ones);
* every 32 requests: ``evict`` down to ``CAPACITY_TOKENS`` (skipped when already below).

Tenants are our namespaces, and upstream's ``extra_key`` so that upstream partitions the same way. No request is
locked while the trace runs, so everything is evictable. Only the tree call is timed: building keys/values that the
scheduler would already hold (upstream's value tensor, a match's slot list) is done outside the timer.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from array import array
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang_iso.platform import bootstrap

bootstrap.apply()

import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

from sglang_iso.cache import TenantRadixTree  # noqa: E402

TENANT_COUNTS = (1, 10, 1000)
PAGE_SIZES = (1, 16)
CAPACITY_TOKENS = 64_000
"""Evict down to this many cached tokens (a small KV pool, so eviction runs throughout)."""
EVICT_EVERY = 32
"""Requests between evict calls."""
VOCAB = 32_000
OPS = ("match", "insert", "evict")


# --------------------------------------------------------------------------------------------------- the trace


@dataclass(frozen=True)
class Request:
    ns: str
    """Tenant namespace (also upstream's ``extra_key``)."""
    tokens: array
    """Token ids, ``array('q')`` (the type upstream's tree requires)."""


@dataclass(frozen=True)
class Evict:
    capacity: int
    """Evict until at most this many tokens stay cached."""


def record_trace(n_requests: int, n_tenants: int, seed: int) -> list[Request | Evict]:
    """A deterministic multi-tenant trace; tenant popularity is Zipf-like (tenant i has weight 1/(i+1))."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    prompts = [[tokens(rng.randint(128, 768)) for _ in range(2)] for _ in range(n_tenants)]
    recent: list[deque[list[int]]] = [deque(maxlen=4) for _ in range(n_tenants)]
    weights = [1 / (i + 1) for i in range(n_tenants)]
    trace: list[Request | Evict] = []
    for i in range(n_requests):
        t = rng.choices(range(n_tenants), weights)[0]
        if recent[t] and rng.random() < 0.25:
            seq = rng.choice(recent[t]) + tokens(rng.randint(16, 128))
        else:
            seq = rng.choice(prompts[t]) + tokens(rng.randint(16, 256))
        seq = seq[:4096]
        recent[t].append(seq)
        trace.append(Request(f"t:tenant{t}:m1", array("q", seq)))
        if (i + 1) % EVICT_EVERY == 0:
            trace.append(Evict(CAPACITY_TOKENS))
    return trace


# -------------------------------------------------------------------------------------------- implementations


class Impl:
    """Adapter over one tree. Timed: ``match``, ``insert``, ``evict``. Untimed: ``slots``, ``pack``, ``cached``."""

    def match(self, ns: str, tokens: array) -> Any:
        raise NotImplementedError

    def slots(self, ns: str, match: Any) -> list[int]:
        """KV slots of a match result."""
        raise NotImplementedError

    def pack(self, slots: list[int]) -> Any:
        """Slots in the form ``insert`` takes."""
        return slots

    def insert(self, ns: str, tokens: array, packed: Any) -> None:
        raise NotImplementedError

    def evict(self, num_tokens: int) -> int:
        raise NotImplementedError

    def cached(self) -> int:
        """Tokens cached (all evictable: the trace holds no locks)."""
        raise NotImplementedError


class Ours(Impl):
    def __init__(self, page_size: int) -> None:
        self.tree = TenantRadixTree(page_size, lambda slots: None)

    def match(self, ns: str, tokens: array) -> Any:
        return self.tree.match(ns, tokens)

    def slots(self, ns: str, match: Any) -> list[int]:
        return match.slots.tolist()

    def pack(self, slots: list[int]) -> Any:
        return array("q", slots)  # what the scheduler hands over: the row's slots as one buffer

    def insert(self, ns: str, tokens: array, packed: Any) -> None:
        self.tree.insert(ns, tokens, packed)

    def evict(self, num_tokens: int) -> int:
        return self.tree.evict(num_tokens)

    def cached(self) -> int:
        return self.tree.evictable_size()


class _NullAllocator:
    """What upstream's trees call on the allocator without memory pools: frees only."""

    device = "cpu"

    def free_segment(self, indices: torch.Tensor, start_pos: int = 0) -> None:
        pass

    def free(self, indices: torch.Tensor) -> None:
        pass


class UpstreamRadix(Impl):
    """``RadixCache.create_simulated``: upstream's classic pure-Python radix tree."""

    def __init__(self, page_size: int) -> None:
        self.tree = RadixCache.create_simulated(mock_allocator=_NullAllocator(), page_size=page_size)

    def match(self, ns: str, tokens: array) -> Any:
        return self.tree.match_prefix(MatchPrefixParams(key=RadixKey(tokens, extra_key=ns)))

    def slots(self, ns: str, match: Any) -> list[int]:
        return self.tree.path_device_indices(match.last_device_node).tolist()

    def pack(self, slots: list[int]) -> Any:
        return torch.tensor(slots, dtype=torch.int64)

    def insert(self, ns: str, tokens: array, packed: Any) -> None:
        self.tree.insert(InsertParams(key=RadixKey(tokens, extra_key=ns), value=packed))

    def evict(self, num_tokens: int) -> int:
        return self.tree.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted

    def cached(self) -> int:
        return self.tree.evictable_size()


class UpstreamUnified(UpstreamRadix):
    """``UnifiedRadixCache`` with the FULL component only: what a plain SGLang server builds by default."""

    backend: str | None = None
    """Tree core backend; None: upstream's default choice (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``)."""

    def __init__(self, page_size: int) -> None:
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        params = CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=_NullAllocator(),
            page_size=page_size,
            tree_components=(ComponentType.FULL,),
            tree_core_backend=self.backend,
        )
        self.tree = UnifiedRadixCache(params)

    def slots(self, ns: str, match: Any) -> list[int]:
        core = self.tree.tree_core
        return core.collect_full_device_indices(match.last_device_node, self.tree.root_node_handle(ns)).tolist()

    def describe(self) -> str:
        return type(self.tree.tree_core).__name__


class UpstreamUnifiedPython(UpstreamUnified):
    backend = "python"


IMPLS: dict[str, Callable[[int], Impl]] = {
    "ours": Ours,
    "radix": UpstreamRadix,
    "unified": UpstreamUnified,
    "unified-py": UpstreamUnifiedPython,
}
"""Name -> factory(page_size). ``radix`` is the baseline of the ratio columns."""
BASELINE = "radix"


# ---------------------------------------------------------------------------------------------------- replay


@dataclass
class Timing:
    ns: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Total nanoseconds per op kind."""
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    request_tokens: int = 0
    """Tokens of all requests (denominator of the hit rate)."""
    hit_tokens: int = 0
    """Tokens served by ``match``."""
    evicted_tokens: int = 0
    """Tokens released by ``evict``."""

    def us_per_op(self, op: str) -> float:
        return self.ns[op] / self.calls[op] / 1000 if self.calls[op] else float("nan")


def replay(impl: Impl, trace: list[Request | Evict]) -> Timing:
    clock = time.perf_counter_ns
    timing = Timing()
    next_slot = 0
    gc.collect()
    gc.disable()
    try:
        for event in trace:
            if isinstance(event, Evict):
                excess = impl.cached() - event.capacity
                if excess <= 0:
                    continue
                t0 = clock()
                timing.evicted_tokens += impl.evict(excess)
                timing.ns["evict"] += clock() - t0
                timing.calls["evict"] += 1
                continue
            t0 = clock()
            found = impl.match(event.ns, event.tokens)
            timing.ns["match"] += clock() - t0
            timing.calls["match"] += 1
            prefix = impl.slots(event.ns, found)
            timing.request_tokens += len(event.tokens)
            timing.hit_tokens += len(prefix)
            fresh = len(event.tokens) - len(prefix)
            packed = impl.pack(prefix + list(range(next_slot, next_slot + fresh)))
            next_slot += fresh
            t0 = clock()
            impl.insert(event.ns, event.tokens, packed)
            timing.ns["insert"] += clock() - t0
            timing.calls["insert"] += 1
    finally:
        gc.enable()
    return timing


def best_of(runs: list[Timing]) -> Timing:
    """Per op kind, the run with the fewest µs per call (evict call counts may differ a little between runs)."""
    best = Timing(request_tokens=runs[0].request_tokens, hit_tokens=runs[0].hit_tokens)
    best.evicted_tokens = runs[0].evicted_tokens
    for op in OPS:
        fastest = min(runs, key=lambda r: r.us_per_op(op) if r.calls[op] else 0.0)
        best.ns[op], best.calls[op] = fastest.ns[op], fastest.calls[op]
    return best


# ----------------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Row:
    config: str
    impl: str
    timing: Timing


def format_table(rows: list[Row]) -> str:
    base = {r.config: r.timing for r in rows if r.impl == BASELINE}
    head = ["config", "impl", "match µs", "insert µs", "evict µs", "match x", "insert x", "evict x", "hit %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        t, b = r.timing, base.get(r.config)
        ratios = [f"{t.us_per_op(op) / b.us_per_op(op):.2f}" if b else "-" for op in OPS]
        hit = 100 * t.hit_tokens / max(1, t.request_tokens)
        cells = [r.config, r.impl, *(f"{t.us_per_op(op):.1f}" for op in OPS), *ratios, f"{hit:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[Row], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written (wanted {path})")
        return
    configs = list(dict.fromkeys(r.config for r in rows))
    impls = list(dict.fromkeys(r.impl for r in rows))
    by = {(r.config, r.impl): r.timing for r in rows}
    fig, axes = plt.subplots(1, len(OPS), figsize=(6 * len(OPS), 4.5))
    width = 0.8 / len(impls)
    for ax, op in zip(axes, OPS, strict=True):
        for k, impl in enumerate(impls):
            ys = [by[(c, impl)].us_per_op(op) if (c, impl) in by else 0 for c in configs]
            ax.bar([i + k * width for i in range(len(configs))], ys, width, label=impl)
        ax.set_xticks([i + width * (len(impls) - 1) / 2 for i in range(len(configs))], configs, rotation=30)
        ax.set_yscale("log")
        ax.set_title(f"{op} (µs per call, log scale)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=3000, help="requests per config (default 3000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="replays per impl and config; best per op is kept")
    parser.add_argument(
        "--impls",
        default=",".join(IMPLS),
        help=f"comma-separated, from {sorted(IMPLS)} (default: all; {BASELINE!r} is the ratio baseline)",
    )
    parser.add_argument("--plot", default="benchmark/tree_ops.png", help='PNG path (needs matplotlib; "": none)')
    args = parser.parse_args(argv)
    names = [n for n in args.impls.split(",") if n]
    unknown = sorted(set(names) - set(IMPLS))
    if unknown:
        parser.error(f"unknown impls {unknown}; choose from {sorted(IMPLS)}")

    usable: list[str] = []
    for name in names:
        try:
            impl = IMPLS[name](1)
        except Exception as exc:
            print(f"skipping {name}: cannot be built without memory pools/GPU: {type(exc).__name__}: {exc}")
            continue
        extra = f" ({impl.describe()})" if isinstance(impl, UpstreamUnified) else ""
        print(f"impl {name}: {type(impl).__name__}{extra}")
        usable.append(name)

    # NOTE: freeze the import-time heap (SGLang, torch) so the per-replay gc.collect() only scans the trees;
    # unfrozen at the end, because nanobind reports still-frozen objects as leaks at exit.
    gc.collect()
    gc.freeze()
    rows: list[Row] = []
    started = time.perf_counter()
    try:
        for n_tenants in TENANT_COUNTS:
            trace = record_trace(args.ops, n_tenants, args.seed)
            for page_size in PAGE_SIZES:
                config = f"T={n_tenants} page={page_size}"
                for name in usable:
                    runs = [replay(IMPLS[name](page_size), trace) for _ in range(args.repeats)]
                    rows.append(Row(config, name, best_of(runs)))
                    elapsed = time.perf_counter() - started
                    print(f"  {config:<18} {name:<11} done ({elapsed:.0f} s)", file=sys.stderr)
    finally:
        gc.unfreeze()
    print()
    print(format_table(rows))
    print(
        f"\n{args.ops} requests per config, seed {args.seed}, best of {args.repeats}, "
        f"{time.perf_counter() - started:.0f} s of replay"
    )
    if args.plot:  # NOTE: --plot "" writes none
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
