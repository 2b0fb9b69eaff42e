"""A seeded, randomized multi-tenant workload against a real server, with leak oracles.

Prompts are sent as token ids (``input_ids``), so the oracle is exact: a
request of owner O (a tenant, or the cache group it belongs to) may be served
at most ``max(LCP(prompt, p) for p sent by O so far)`` cached tokens, or the
declared shared prefix when O may read it. Anything more came from another
tenant: a leak. Every tenant's prompts start with its own canary tokens, so no
two tenants' prompts even share a first token by accident.

LoRA adapters: some tenants may use adapters (``t1`` and ``t2`` the same name,
the group ``g1`` its own). A namespace is an owner *and* an adapter, so the bound
is taken over the prompts the owner sent with the same adapter (or none), and a
LoRA request never counts the base model's shared prefix. Requests re-send
prompts of the owner's other adapters (cross-adapter probes) and name adapters
the tenant may not use (which must be refused with 403).

Operations (seeded): generate (reuse of an own earlier prompt with a new tail,
a fresh prompt, the shared prefix, the same "public" text for everyone), with a
random allowed adapter or none,
streaming with an early disconnect, admin abort of a running request, tenant
flush, concurrent bursts. Oracles at the end: violation counters 0, the tree's
``check_integrity()`` clean, no locked entries when idle, every request
answered (200) or explicitly refused, and same-owner hits observed (the positive
control: a server with caching off would fail it).
"""

from __future__ import annotations

import http.client
import json
import random
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_iso.tenancy.keys import key_sha256, new_api_key
from sglang_iso_testing.lora_adapter import write_tiny_adapter
from sglang_iso_testing.process import ServerProcess
from sglang_iso_testing.progress import Progress

VOCAB_LOW, VOCAB_HIGH = 16, 2000  # ordinary token ids of the bundled model (0-6 are special)
SHARED_TEXT = " ".join(f"Policy {i}: be kind, be brief, cite the handbook." for i in range(6))
ADAPTERS = {"t1": ("ad-a",), "t2": ("ad-a", "ad-b"), "t3": ("ad-a",), "g1a": ("ad-g", "ad-a"), "g1b": ("ad-g",)}
"""Adapters each tenant may use (``t4``: none); all are loaded at start."""
ADAPTER_SEEDS = {"ad-a": 11, "ad-b": 12, "ad-g": 13}


@dataclass
class Tenant:
    id: str
    owner: str  # namespace owner: the tenant, or its cache group
    cache: str
    key: str
    canary: list[int]
    reads_shared: bool
    adapters: tuple[str, ...] = ()


@dataclass
class FuzzReport:
    requests: int = 0
    ok: int = 0
    refused: int = 0  # explicit 4xx answers (aborts)
    same_owner_hits: int = 0
    adapter_hits: int = 0  # same-owner, same-adapter hits of LoRA requests (their positive control)
    adapter_refusals: int = 0  # 403s for adapters not on the tenant's list
    leaks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def write_tenants(directory: Path, *, lora: bool = True, shared: bool = True) -> tuple[Path, list[Tenant], str]:
    """The fuzzer's tenants file (and, with ``lora``, its adapters for the bundled model) in ``directory``, with a
    quota on t2; without ``shared`` it has no shared prefix (what a hybrid-tree server refuses)."""
    rng = random.Random(7)
    plan = [
        ("t1", "private"),
        ("t2", "private"),
        ("t3", "off"),
        ("g1a", "group:g1"),
        ("g1b", "group:g1"),
        ("t4", "private"),
    ]
    admin = new_api_key()
    tenants = []
    for tid, cache in plan:
        canary = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(3)]
        owner = cache.split(":", 1)[1] if cache.startswith("group:") else tid
        reads_shared = shared and tid in ("t1", "t2", "g1a", "g1b")
        adapters = ADAPTERS.get(tid, ()) if lora else ()
        tenants.append(Tenant(tid, owner, cache, new_api_key(), canary, reads_shared, adapters))
    (directory / "s.key").write_bytes(secrets.token_bytes(32))
    lines = ['namespace_secret_file = "s.key"', f'admin_key_sha256 = ["{key_sha256(admin)}"]']
    for t in tenants:
        lines += ["[[tenants]]", f'id = "{t.id}"', f'key_sha256 = ["{key_sha256(t.key)}"]', f'cache = "{t.cache}"']
        if t.id == "t2":
            lines.append("quota_tokens = 900")
        lines.append("adapters = [" + ", ".join(f'"{a}"' for a in t.adapters) + "]")
    for name, seed in ADAPTER_SEEDS.items() if lora else ():
        write_tiny_adapter(directory / "adapters" / name, seed=seed)
    readers = ", ".join(f'"{t.id}"' for t in tenants if t.reads_shared)
    if shared:
        lines += ["[[shared_prefixes]]", 'name = "policy"', f'text = "{SHARED_TEXT}"', f"tenants = [{readers}]"]
    path = directory / "tenants.toml"
    path.write_text("\n".join(lines) + "\n")
    return path, tenants, admin


def server_flags(tenants_file: Path, *, lora: bool = True) -> tuple[str, ...]:
    # A pool of ~10 long prompts: eviction and quota pressure happen all the time.
    pool = ("--tenants-file", str(tenants_file), "--max-total-tokens", "2048", "--max-running-requests", "8")
    if not lora:
        return pool
    # Three adapters, two per batch: adapter slots are swapped under load too.
    adapters = [f"{name}={tenants_file.parent / 'adapters' / name}" for name in ADAPTER_SEEDS]
    return (
        *pool, "--enable-lora", "--max-loras-per-batch", "2", "--max-lora-rank", "8",
        "--lora-target-modules", "q_proj", "v_proj", "--lora-paths", *adapters,
    )  # fmt: skip


class LeakFuzzer:
    def __init__(
        self, server: ServerProcess, tenants: list[Tenant], admin: str, shared_ids: list[int], seed: int,
        *, conversations: bool = False,
    ) -> None:  # fmt: skip
        """With ``conversations``, a served request's prompt and reply count as the owner's (its own tokens), and
        half the reuses continue a whole earlier exchange: what a model that caches state only at the end of an
        exchange (hybrid linear attention) can hit."""
        self.server = server
        self.conversations = conversations
        self.tenants = tenants
        self.admin = admin
        self.shared_ids = shared_ids
        self.rng = random.Random(seed)
        # (namespace owner, adapter or None) -> prompts sent: the unit that may share KV
        self.sent: dict[tuple[str, str | None], list[list[int]]] = {}
        self.report = FuzzReport()

    # ------------------------------------------------------------------ workload
    def run(self, ops: int, *, max_seconds: float, progress: Progress | None = None) -> FuzzReport:
        """Run up to ``ops`` operations or ``max_seconds``; ``progress`` (if given) counts each operation."""
        deadline = time.monotonic() + max_seconds
        with ThreadPoolExecutor(max_workers=4) as pool:
            for _ in range(ops):
                if time.monotonic() > deadline:
                    break
                kind = self.rng.random()
                if kind < 0.6:
                    self.generate(self.rng.choice(self.tenants))
                elif kind < 0.75:
                    burst = [self.rng.choice(self.tenants) for _ in range(4)]
                    list(pool.map(self.generate, burst))
                elif kind < 0.85:
                    self.stream_and_disconnect(self.rng.choice(self.tenants))
                elif kind < 0.95:
                    self.abort_while_running(self.rng.choice(self.tenants), pool)
                else:
                    self.flush(self.rng.choice(self.tenants))
                if progress is not None:
                    progress.step(note=self._counters())
        return self.report

    def _counters(self) -> str:
        r = self.report
        return (
            f"[requests {r.requests}, same-owner hits {r.same_owner_hits}, "
            f"leaks {len(r.leaks)}, errors {len(r.errors)}]"
        )

    def pick_adapter(self, t: Tenant) -> str | None:
        """None (base model) about half the time, else one of the tenant's adapters."""
        if not t.adapters or self.rng.random() < 0.5:
            return None
        return self.rng.choice(t.adapters)

    def bucket(self, t: Tenant, adapter: str | None) -> list[list[int]]:
        return self.sent.setdefault((t.owner, adapter), [])

    def prompt_for(self, t: Tenant, adapter: str | None = None) -> list[int]:
        r = self.rng.random()
        own = self.bucket(t, adapter)
        if r < 0.35 and own:
            base = self.rng.choice(own)
            whole = self.conversations and self.rng.random() < 0.5
            cut = len(base) if whole else self.rng.randrange(1, len(base) + 1)
            return base[:cut] + self.tokens(self.rng.randrange(1, 40))
        others = [p for (owner, a), ps in self.sent.items() if owner == t.owner and a != adapter for p in ps]
        if r < 0.45 and others:
            # Cross-adapter probe: the owner's own prompt, sent before with another adapter (or none).
            return self.rng.choice(others) + self.tokens(self.rng.randrange(1, 10))
        if r < 0.55 and t.reads_shared:
            return self.shared_ids + t.canary + self.tokens(self.rng.randrange(5, 80))
        if r < 0.7:
            # Every tenant sends the very same public text after its canary: only the canary differs.
            return t.canary + self.public
        return t.canary + self.tokens(self.rng.randrange(20, 250))

    @property
    def public(self) -> list[int]:
        if not hasattr(self, "_public"):
            self._public = [random.Random(99).randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(200)]
        return self._public

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]

    def generate(self, t: Tenant, ids: list[int] | None = None) -> None:
        if self.rng.random() < 0.05:
            self.use_foreign_adapter(t)
            return
        adapter = self.pick_adapter(t)
        ids = ids if ids is not None else self.prompt_for(t, adapter)
        allowed = self.allowed_hit(t, ids, adapter)
        self.bucket(t, adapter).append(ids)
        body: dict[str, Any] = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        if adapter is not None:
            body["lora_path"] = adapter
        status, out = self.server.post("/generate", body, headers=self.auth(t.key), timeout_s=300)
        self.check_answer(t, status, out, allowed, adapter)
        if self.conversations and status == 200 and isinstance(out, dict):
            self.bucket(t, adapter).append(ids + list(out.get("output_ids") or []))

    def use_foreign_adapter(self, t: Tenant) -> None:
        """Name an adapter the tenant may not use: must be a 403, never served."""
        foreign = [a for a in ADAPTER_SEEDS if a not in t.adapters] + ["never-loaded"]
        adapter = self.rng.choice(foreign)
        body = {"input_ids": t.canary + self.tokens(20), "lora_path": adapter, "sampling_params": {"max_new_tokens": 2}}
        status, out = self.server.post("/generate", body, headers=self.auth(t.key), timeout_s=300)
        self.report.requests += 1
        if status == 403:
            self.report.refused += 1
            self.report.adapter_refusals += 1
        elif status == 200:
            self.report.leaks.append(f"{t.id}: served adapter {adapter!r} it may not use")
        else:
            self.report.errors.append(f"{t.id} foreign adapter {adapter!r}: HTTP {status} {str(out)[:200]}")

    def stream_and_disconnect(self, t: Tenant) -> None:
        ids = self.prompt_for(t)
        self.bucket(t, None).append(ids)
        body = json.dumps({"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 64}})
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        try:
            conn.request("POST", "/generate", body, {**self.auth(t.key), "Content-Type": "application/json"})
            resp = conn.getresponse()
            self.report.requests += 1
            if resp.status == 200:
                resp.read(self.rng.randrange(1, 300))
                self.report.ok += 1
            else:
                self.report.errors.append(f"stream {t.id}: HTTP {resp.status}")
        finally:
            conn.close()

    def abort_while_running(self, t: Tenant, pool: ThreadPoolExecutor) -> None:
        ids = self.prompt_for(t)
        self.bucket(t, None).append(ids)
        rid = f"fz{self.rng.randrange(10**9)}"
        body = {"input_ids": ids, "rid": rid, "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}}
        pending = pool.submit(self.server.post, "/generate", body, headers=self.auth(t.key), timeout_s=300)
        time.sleep(self.rng.random() * 0.5)
        self.server.post("/abort_request", {"rid": f"{t.id}.{rid}"}, headers=self.auth(self.admin))
        status, out = pending.result(timeout=300)
        self.check_answer(t, status, out, allowed=None)

    def flush(self, t: Tenant) -> None:
        status, out = self.server.post("/iso/flush", {"tenant": t.id}, headers=self.auth(self.admin))
        if status != 200:
            self.report.errors.append(f"flush {t.id}: HTTP {status} {out}")

    # ------------------------------------------------------------------ oracles
    def allowed_hit(self, t: Tenant, ids: list[int], adapter: str | None = None) -> int:
        if t.cache == "off":
            return 0
        best = max((_lcp(ids, p) for p in self.bucket(t, adapter)), default=0)
        # NOTE: shared prefixes hold base-model KV; a LoRA request may never read one.
        if adapter is None and t.reads_shared and ids[: len(self.shared_ids)] == self.shared_ids:
            best = max(best, len(self.shared_ids))
        return best

    def check_answer(self, t: Tenant, status: int, out: Any, allowed: int | None, adapter: str | None = None) -> None:
        self.report.requests += 1
        if status == 200 and isinstance(out, dict):
            self.report.ok += 1
            cached = int(out["meta_info"].get("cached_tokens", 0))
            if allowed is not None and cached > allowed:
                self.report.leaks.append(f"{t.id} adapter={adapter}: cached {cached} > same-owner bound {allowed}")
            if cached > 0 and t.cache != "off":
                self.report.same_owner_hits += 1
                self.report.adapter_hits += adapter is not None
        elif 400 <= status < 500:
            self.report.refused += 1
        else:
            self.report.errors.append(f"{t.id}: HTTP {status} {str(out)[:200]}")

    def final_checks(self) -> list[str]:
        problems = []
        deadline = time.monotonic() + 60
        while True:
            status, out = self.server.get_with("/iso/tenants", self.auth(self.admin))
            ranks = [r for info in out["tenants"].values() for r in info["ranks"] if r] if status == 200 else []
            if status == 200 and not any(r.get("protected_tokens") for r in ranks):
                break
            if time.monotonic() > deadline:
                problems.append(f"entries still locked when idle: {out}")
                break
            time.sleep(0.5)
        if any(r.get("violations") for r in ranks):
            problems.append(f"violation counters: {out}")
        status, info = self.server.get_with("/get_server_info", self.auth(self.admin))
        tree = info["internal_states"][0]["sglang_iso"]["tree_cache"] if status == 200 else {}
        unverified = out.get("unverified_tags") if isinstance(out, dict) else None
        if tree.get("violations") or tree.get("rejected_tags") or any(unverified or []):
            problems.append(f"scheduler counters: {tree}")
        status, check = self.server.get_with("/iso/check", self.auth(self.admin))
        if status != 200 or not check.get("integrity_ok"):
            problems.append(f"check_integrity failed: {status} {check}")
        return problems

    @staticmethod
    def auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}


def shared_prefix_ids(model_dir: Path) -> list[int]:
    """The declared prefix as the server declares it: plain encoding, last token dropped."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(SHARED_TEXT, add_special_tokens=False).ids[:-1]


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
