"""In-process soak of the tenant cache: SGLang's real allocator, row table and KV pool, no HTTP, no model.

A seeded random schedule does what the scheduler does to the cache: requests of many tenants (match, lock, allocate
the rest, write its KV, insert, free duplicates, finish now or later while holding the lock), eviction under
pressure, tenant flushes and flushes of everything (a weight update), with the host tier on or off. The oracle is
in the KV itself: every slot a request fills holds its tenant's code, the token and its position, so a read of
anything not the tenant's own (another tenant's slot, a stale or freed slot, a wrong position) is seen the
moment a match returns it. Every ``check_every`` operations: the recent prompts of every tenant (of 64 drawn
at random, with more) are matched and verified again, every free slot must be zero once the pending scrub ran
(poison-and-check), slots held by requests in flight must still hold their data (control), the tree's invariants
must hold, and the cache's own fail-closed checks must have counted no isolation violation (a refusal there is a
bug caught, and a failure of the run).

    soak = Soak(SoakConfig(seed=7, tenants=64))
    result = soak.run(100_000, progress=Progress("soak", 100_000, unit="ops"))
    result.failure      # None, or what was found, at which operation, and the replay command

``plant="double_hand"`` frees one of a tenant's resident slots behind the tree's back once (a slot handed to two
owners), ``plant="overwrite"`` writes another tenant's KV into one: the soak must find either.
"""

from __future__ import annotations

import random
import secrets
from array import array
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_iso.identity.tags import NamespaceResolver, make_tag
from sglang_iso.integration.host_cache import HostCache
from sglang_iso.integration.owner_check import OwnerTable
from sglang_iso.integration.scrub import KvScrubber
from sglang_iso.integration.tenant_cache import TenantPolicy, TenantRadixCache
from sglang_iso_testing.progress import Progress

VOCAB = 4096
TOPICS = 16
"""Prompt prefixes every tenant uses (the same tokens in every namespace: the tempting cross-tenant hits)."""


@dataclass(frozen=True)
class SoakConfig:
    seed: int = 0
    tenants: int = 16
    page_size: int = 1
    pool_tokens: int = 8192
    host_tokens: int = 0
    """Host tier size in tokens (0: no host tier)."""
    check_every: int = 1000
    max_in_flight: int = 8
    plant_at: int = 750
    """The operation at which ``plant`` acts."""
    plant: str | None = None
    """Once, at operation ``plant_at``: ``double_hand`` frees one of a tenant's resident slots behind the tree's
    back (the allocator hands it to another owner); ``overwrite`` writes another tenant's KV into one of them."""


@dataclass
class SoakResult:
    ops: int = 0
    requests: int = 0
    hit_tokens: int = 0
    matched_requests: int = 0
    checks: int = 0
    verified_slots: int = 0
    evictions: int = 0
    flushes: int = 0
    failure: str | None = None
    counts: dict[str, int] = field(default_factory=dict)


class SoakFailure(Exception):
    pass


class _RowRequest:
    """What SGLang's row pool and the page-ownership table read of a request (the table keeps a weak reference)."""

    def __init__(self, extra_key: str) -> None:
        self.kv = SimpleNamespace(holds_kv=False, req_pool_idx=None, kv_allocated_len=0)
        self.extra_key = extra_key
        self.cache_salt = None


class Soak:
    def __init__(self, config: SoakConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        ps = config.page_size
        self.kv = MHATokenToKVPool(size=config.pool_tokens, page_size=ps, dtype=torch.float32, head_num=1, head_dim=4,
                                   layer_num=1, device="cpu", enable_memory_saver=False)  # fmt: skip
        if ps == 1:
            self.allocator: Any = TokenToKVPoolAllocator(config.pool_tokens, torch.float32, "cpu", self.kv, False)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(config.pool_tokens, ps, torch.float32, "cpu", self.kv, False)
        rows = ReqToTokenPool(size=4, max_context_len=1024, device="cpu", enable_memory_saver=False)
        self.rows = rows
        secret = secrets.token_bytes(32)
        self.names = [f"t{i:05d}" for i in range(config.tenants)]
        self.codes = {name: float(i + 1) for i, name in enumerate(self.names)}
        policies = {name: TenantPolicy(None, "private") for name in self.names}
        params = CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=self.allocator,
                                 page_size=ps)  # fmt: skip
        self.cache = TenantRadixCache(params, NamespaceResolver(secret), policies)
        self.cache.scrubber = KvScrubber(self.allocator, rows).install()
        self.cache.page_owners = self.page_owners = OwnerTable(self.cache).install()
        if config.host_tokens:
            self.cache.host = HostCache(self.cache, config.host_tokens)
            self.cache.tree.set_spill(self.cache.host.spill)
        self.tags = {name: make_tag(secret, name, secrets.token_hex(32)) for name in self.names}
        self.topics = [self._tokens(self.rng.randrange(4, 17) * 16) for _ in range(TOPICS)]
        self.recent: dict[str, list[list[int]]] = {name: [] for name in self.names}
        self.in_flight: list[tuple[str, Any, list[int], torch.Tensor]] = []
        self.result = SoakResult()
        self._planted = False

    # ------------------------------------------------------------------------------------------------ running
    def run(self, ops: int, progress: Progress | None = None) -> SoakResult:
        """Run ``ops`` operations (stops at the first failure, recorded in the result)."""
        weights = {"request": 70, "finish": 12, "evict": 8, "flush_tenant": 1, "flush_all": 0.02}
        kinds, w = list(weights), list(weights.values())
        try:
            for i in range(ops):
                self.result.ops = i + 1
                if self.config.plant and not self._planted and i >= self.config.plant_at:
                    self._plant()
                kind = self.rng.choices(kinds, w)[0]
                getattr(self, "_" + kind)()
                self.result.counts[kind] = self.result.counts.get(kind, 0) + 1
                if (i + 1) % self.config.check_every == 0:
                    self.check()
                if progress is not None:
                    progress.step()
            self.check()
        except SoakFailure as exc:
            cfg = self.config
            self.result.failure = (
                f"operation {self.result.ops}: {exc}\n  replay: python benchmark/soak.py --seed {cfg.seed} "
                f"--tenants {cfg.tenants} --page-size {cfg.page_size} --pool-tokens {cfg.pool_tokens} "
                f"--host-tokens {cfg.host_tokens} --check-every {cfg.check_every} --ops {self.result.ops}"
                + (f" --plant {cfg.plant} --plant-at {cfg.plant_at}" if cfg.plant else "")
            )
        return self.result

    # ------------------------------------------------------------------------------------------------ operations
    def _request(self, tenant: str | None = None, tokens: list[int] | None = None) -> None:
        tenant = tenant or self._pick_tenant()
        recent = self.recent[tenant]
        if tokens is None:
            follow_up = bool(recent) and self.rng.random() < 0.4  # a follow-up of its own conversation
            base = self.rng.choice(recent) if follow_up else self.rng.choice(self.topics)
            tokens = base + self._tokens(self.rng.randrange(1, 5) * 16)
        ps = self.config.page_size
        tokens = tokens[: len(tokens) - len(tokens) % ps]
        node, matched = self._match_and_verify(tenant, tokens)
        self.result.requests += 1
        self.cache.inc_lock_ref(node)
        done = int(matched.numel())
        need = len(tokens) - done
        new = self._alloc(need) if need else torch.empty(0, dtype=torch.int64)
        if new is None:
            self.cache.dec_lock_ref(node)
            self.result.counts["no_room"] = self.result.counts.get("no_room", 0) + 1
            return
        self._write(tenant, tokens, new, start=done)
        value = torch.cat([matched.to(torch.int64), new.to(torch.int64)])
        self._forward_check(tenant, value, done)
        prefix = self.cache.insert(InsertParams(key=self._key(tenant, tokens), value=value)).prefix_len
        if prefix > done:
            self.allocator.free(new[: prefix - done])  # another request cached them first: ours are duplicates
        recent.append(tokens)
        del recent[:-8]
        if len(self.in_flight) < self.config.max_in_flight and self.rng.random() < 0.3:
            self.in_flight.append((tenant, node, tokens, matched.clone()))
        else:
            self.cache.dec_lock_ref(node)

    def _forward_check(self, tenant: str, value: torch.Tensor, done: int) -> None:
        """What the scheduler does around the request's forward: a row of ``req_to_token`` holding the matched
        and new slots, the page-ownership check over it (new pages adopted, every other page must be the
        tenant's), then the row freed. A refused slot is counted by the table (a failure at the next check)."""
        req = _RowRequest(self.tags[tenant])
        rows = self.rows.alloc([req])
        if rows is None:
            raise SoakFailure("no free req_to_token row (rows leak)")
        row, n = rows[0], int(value.numel())
        self.rows.req_to_token[row, :n] = value.to(self.rows.req_to_token.dtype)
        window = torch.tensor([[row], [n], [done]])  # one tensor made, three views: rows, ends, write starts
        self.page_owners.check_window(window[0], window[1], window[2], n)
        self.rows.free_rows([row])

    def _pick_tenant(self) -> str:
        """Popularity as on a real platform: the busiest tenth of the tenants sends 60% of the requests."""
        hot = max(1, len(self.names) // 10)
        return self.rng.choice(self.names[:hot] if self.rng.random() < 0.6 else self.names)

    def _finish(self) -> None:
        if self.in_flight:
            _, node, _, _ = self.in_flight.pop(self.rng.randrange(len(self.in_flight)))
            self.cache.dec_lock_ref(node)

    def _evict(self) -> None:
        self.cache.evict(EvictParams(num_tokens=self.rng.randrange(1, self.config.pool_tokens // 4)))
        self.result.evictions += 1

    def _flush_tenant(self) -> None:
        self.cache.flush_owner(self._pick_tenant())
        self.result.flushes += 1

    def _flush_all(self) -> None:
        self.cache.flush_owner("*")
        self.result.flushes += 1

    def _plant(self) -> None:
        """The fault, on the newest cached prompt of the first tenant that has one."""
        for tenant in self.names:
            for tokens in reversed(self.recent[tenant]):
                _, found = self._match_and_verify(tenant, tokens)
                if not found.numel():
                    continue
                slot = found[-1:].to(torch.int64)
                if self.config.plant == "overwrite":
                    other = self.names[(self.names.index(tenant) + 1) % len(self.names)]
                    self._write(other, tokens, slot, start=int(found.numel()) - 1)
                    self._planted = True
                    self._request(tenant, tokens)  # the owner comes back to its conversation
                    return
                ps = self.config.page_size
                self.allocator.free(slot - slot % ps + torch.arange(ps) if ps > 1 else slot)
                self._planted = True
                return

    # ------------------------------------------------------------------------------------------------ oracle
    def check(self) -> None:
        """Every tenant's recent prompts verified, free slots zero, held slots intact, tree invariants."""
        self.result.checks += 1
        sample = self.names if len(self.names) <= 64 else self.rng.sample(self.names, 64)
        for tenant in sample:
            for tokens in self.recent[tenant]:
                self._match_and_verify(tenant, tokens)
        if self.cache.scrubber is None:
            raise RuntimeError("the soak runs with the scrubber: its oracle reads freed slots as zero")
        self.cache.scrubber.flush()
        free = self._free_slots()
        if free.numel():
            dirty = int(torch.count_nonzero(self.kv.k_buffer[0][free]) + torch.count_nonzero(self.kv.v_buffer[0][free]))
            if dirty:
                raise SoakFailure(f"{dirty} nonzero values in free slots after the scrub")
        for tenant, _, tokens, slots in self.in_flight:
            self._verify(tenant, tokens, slots, "held by a request in flight")
        if not self.cache.check_integrity():
            raise SoakFailure("tree integrity check failed")
        self._owner_table_matches_the_tree()
        self._no_violations()

    def _owner_table_matches_the_tree(self) -> None:
        """Every page the tree holds is its namespace's in the page-ownership table."""
        ps = self.config.page_size
        for ns, slots in self.cache.tree.entries():
            if not slots:
                continue
            pages = torch.tensor(slots, dtype=torch.int64) // ps
            wrong = self.page_owners.page_owner[pages] != self.page_owners.slot_of(ns)
            if bool(wrong.any()):
                i = int(torch.nonzero(wrong)[0])
                raise SoakFailure(
                    f"page {int(pages[i])} of namespace {ns[:24]} is owner slot "
                    f"{int(self.page_owners.page_owner[pages[i]])} in the ownership table, "
                    f"not {self.page_owners.slot_of(ns)}"
                )

    def _no_violations(self) -> None:
        """The cache's own fail-closed checks count what they refused: in a sound run there is nothing."""
        status = self.cache.iso_status()
        counted = {k: status.get(k, 0) for k in ("violations", "rejected_tags", "owner_violations", "host_violations")}
        if any(counted.values()):
            raise SoakFailure(f"the cache counted isolation violations: {counted}")

    def _match_and_verify(self, tenant: str, tokens: list[int]) -> tuple[Any, torch.Tensor]:
        """(the match's last node, its slots), verified."""
        found = self.cache.match_prefix(MatchPrefixParams(key=self._key(tenant, tokens)))
        slots = self.cache.path_device_indices(found.last_device_node)[: found.device_prefix_len]
        if slots.numel():
            self.result.matched_requests += 1
            self.result.hit_tokens += int(slots.numel())
            self._verify(tenant, tokens, slots, "returned by a match")
        return found.last_device_node, slots

    def _verify(self, tenant: str, tokens: list[int], slots: torch.Tensor, how: str) -> None:
        n = int(slots.numel())
        idx = slots.to(torch.int64)
        k = self.kv.k_buffer[0][idx, 0]
        v = self.kv.v_buffer[0][idx, 0]
        expect_k = torch.tensor([self._code(tenant), 1.0, 0.0, 0.0]).expand(n, 4)
        positions = torch.arange(n, dtype=torch.float32)
        expect_v = torch.stack([torch.tensor(tokens[:n], dtype=torch.float32), positions,
                                torch.zeros(n), torch.ones(n)], dim=1)  # fmt: skip
        bad = ~(torch.all(k == expect_k, dim=1) & torch.all(v == expect_v, dim=1))
        self.result.verified_slots += n
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            owner = self._owner_of_code(float(k[i, 0]))
            raise SoakFailure(
                f"tenant {tenant}: slot {int(idx[i])} {how} at position {i} holds tenant {owner}'s data "
                f"(token {float(v[i, 0]):.0f} at position {float(v[i, 1]):.0f}; expected token {tokens[i]})"
            )

    # ------------------------------------------------------------------------------------------------ helpers
    def _write(self, tenant: str, tokens: list[int], slots: torch.Tensor, start: int) -> None:
        n = int(slots.numel())
        idx = slots.to(torch.int64)
        self.kv.k_buffer[0][idx, 0] = torch.tensor([self._code(tenant), 1.0, 0.0, 0.0])
        values = torch.zeros((n, 4), dtype=torch.float32)  # token, position, 0, 1
        values[:, 0] = torch.tensor(tokens[start : start + n], dtype=torch.float32)
        torch.arange(start, start + n, out=values[:, 1])
        values[:, 3] = 1.0
        self.kv.v_buffer[0][idx, 0] = values

    def _alloc(self, need: int) -> torch.Tensor | None:
        for attempt in range(3):
            slots = self.allocator.alloc(need)
            if slots is not None:
                return slots
            if attempt == 0:
                self.cache.evict(EvictParams(num_tokens=need))
            else:
                while self.in_flight:  # pressure: running requests finish
                    self._finish()
                self.cache.evict(EvictParams(num_tokens=need))
        return None

    def _free_slots(self) -> torch.Tensor:
        lists = (getattr(self.allocator, "free_pages", None), getattr(self.allocator, "release_pages", None))
        pages = [p for p in lists if isinstance(p, torch.Tensor)]
        if not pages:
            return torch.empty(0, dtype=torch.int64)
        ids = torch.cat(pages).to(torch.int64)
        ps = self.config.page_size
        return (ids[:, None] * ps + torch.arange(ps)).reshape(-1) if ps > 1 else ids

    def _key(self, tenant: str, tokens: list[int]) -> RadixKey:
        return RadixKey(array("q", tokens), extra_key=self.tags[tenant])

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(1, VOCAB) for _ in range(n)]

    def _code(self, tenant: str) -> float:
        return self.codes[tenant]

    def _owner_of_code(self, code: float) -> str:
        i = int(code) - 1
        return self.names[i] if 0 <= i < len(self.names) and code == int(code) else f"<none: {code}>"
