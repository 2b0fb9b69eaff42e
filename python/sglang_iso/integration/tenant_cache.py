"""``TenantRadixCache``: the tenant-partitioned tree as SGLang's scheduler sees it.

SGLang calls a tree cache with ``RadixKey``s, torch index tensors and requests;
:class:`sglang_iso.cache.TenantRadixTree` knows only namespaces, token lists and
slot ints. This adapter translates between the two and adds nothing to the
isolation logic, which lives in the pure tree:

* the namespace of a key comes from :class:`NamespaceResolver` (never from raw
  client strings); a key that resolves to no namespace gets no sharing at all;
* every slot that leaves the tree goes through :meth:`TenantRadixCache._release_slots`,
  the single hand-over point to the allocator (where page scrubbing plugs in).

Request lifecycle (page_size p; ``protected`` = ``req.kv.cache_protected_len``)::

    row:  [0 ...... protected) [protected ...... up_to)
          tree's slots (locked) request's own slots
    checkpoint: insert [0, up_to) -> tree keeps what it already had (the request's
    duplicates are freed), stores the rest, the row is repointed to the tree's
    slots and ``protected`` advances to what the tree now holds for this key.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.radix_cache import RadixKey

from sglang_iso.cache import NodeHandle, TenantRadixTree
from sglang_iso.cache.pair_keys import pair_key
from sglang_iso.constants import BACKEND_NAME, CachePolicy
from sglang_iso.identity.tags import Namespace, NamespaceResolver
from sglang_iso.integration.cache_report import CacheReport
from sglang_iso.integration.fairness import KvShares
from sglang_iso.integration.shared_prefixes import SCOPE as SHARED_SCOPE

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    from sglang_iso.integration.host_cache import HostCache
    from sglang_iso.integration.owner_check import OwnerTable
    from sglang_iso.integration.pd_transfer import PdGuard
    from sglang_iso.integration.scrub import KvScrubber, SwaScrubber

logger = logging.getLogger(__name__)


class TenantPolicy(NamedTuple):
    """Cache settings of one namespace owner (a tenant, or a cache group)."""

    quota_tokens: int | None  # cap on resident tokens per namespace; None = unlimited
    policy: CachePolicy  # "private" or "off"
    host_quota_tokens: int | None = None  # cap on the owner's host-tier tokens, all namespaces; None = unlimited
    l3_quota_tokens: int | None = None  # cap on the owner's L3 tokens; None = only the store's overall cap


class IsoNode:
    """What the scheduler holds as ``req.last_node``: a tree handle plus its path's slots.

    ``indices`` are only valid while the handle is locked (as upstream's contract
    for ``path_device_indices``).
    """

    __slots__ = ("handle", "indices", "namespace")

    def __init__(self, handle: NodeHandle, indices: torch.Tensor, namespace: str | None) -> None:
        self.handle = handle
        self.indices = indices
        self.namespace = namespace


class TenantRadixCache(BasePrefixCache):
    """The tree cache sglang-iso serves with (registered as ``tenant``)."""

    sglang_iso_backend = BACKEND_NAME

    def __init__(
        self,
        params: CacheInitParams,
        resolver: NamespaceResolver,
        policies: dict[str, TenantPolicy] | None = None,
    ) -> None:
        self.disable = bool(params.disable)
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = int(params.page_size)
        # NOTE: an EAGLE-style draft head's KV at position i depends on token i + 1, so with one the tree is
        # keyed by token pairs (as SGLang's own tree does for EAGLE): see ``cache/pair_keys.py``.
        self.pair_keys = bool(getattr(params, "is_eagle", False))
        self.resolver = resolver
        allocator = self.token_to_kv_pool_allocator
        dev = getattr(allocator, "device", "cpu") if allocator is not None else "cpu"
        self.device = torch.device(dev) if isinstance(dev, str | torch.device) else torch.device("cpu")
        if params.enable_metrics:
            self.init_metrics_collector()
        self.policies = dict(policies or {})  # owner -> settings, applied when a namespace first appears
        self._configured: dict[str, Namespace] = {}  # namespace key -> the namespace, once configured
        self.tree = TenantRadixTree(self.page_size, self._release_slots)
        self.scrubber: KvScrubber | SwaScrubber | None = None  # with --kv-scrub on-free (set by the factory)
        self.erase_receipts: dict[str, dict[str, int]] = {}  # receipt id -> what an erase dropped (newest last)
        self.page_owners: OwnerTable | None = None  # with --kv-owner-check on (set by the factory)
        self.pd_guard: PdGuard | None = None  # on a prefill/decode worker (set by the factory)
        self.host: HostCache | None = None  # with --enable-hierarchical-cache (set by the factory)
        self.kv_shares: KvShares | None = None  # per-owner KV shares with a tenants file (set by the factory)
        self.token_to_kv_pool_host: Any = None  # the same object: SGLang's metrics read its sizes
        # NOTE: read by SGLang's idle check when --enable-hierarchical-cache is on; the host tier copies
        # synchronously, so nothing is ever in flight.
        self.ongoing_write_through: dict[int, Any] = {}
        self.ongoing_load_back: dict[int, Any] = {}
        self.enable_storage = False
        self.report = CacheReport(self, BACKEND_NAME)
        self._empty_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        self.root_node = IsoNode(NodeHandle(()), self._empty_indices, None)

    # ------------------------------------------------------------------------------------------ scheduler API

    def reset(self) -> None:
        """Drop every entry (their slots go back through the release path)."""
        self.tree.reset()
        if self.host is not None:
            self.host.reset()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """Longest cached prefix of ``params.key`` in the key's own namespace."""
        looked_up = self._lookup(params.key)
        if looked_up is None:
            return self._miss()
        ns, tokens = looked_up
        found = self.tree.match(ns, tokens)
        if self.host is not None and self.host.load_back(ns, tokens, found):
            # The same lookup, read again: counted once, its hits being what was on the device (loads count apart).
            found = self.tree.match(ns, tokens, count=False)
        self.report.maybe_export()
        if found.prefix_len == 0:
            return self._miss()
        node = IsoNode(found.last_node, self._tensor(found.slots), ns)
        return MatchResult(
            device_prefix_len=found.prefix_len,
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
        )

    def touch_prefix(self, key: RadixKey) -> None:
        looked_up = self._lookup(key)
        if looked_up is not None:
            self.tree.match(*looked_up, count=False)

    def insert(self, params: InsertParams) -> InsertResult:
        """Store ``params.value`` for ``params.key``; the caller frees its duplicates.

        Returns the cached prefix length, as upstream does. Use :meth:`checkpoint`
        for requests: it also frees duplicates and repoints the request's row.
        """
        key = params.key
        ns = self._namespace(key) if key is not None else None
        if self.disable or ns is None or key is None or params.value is None:
            return InsertResult(prefix_len=0)
        tokens = self.tree_key(key.token_ids[: len(key)])
        if tokens is None:
            return InsertResult(prefix_len=0)
        n = len(tokens) - len(tokens) % self.page_size
        result = self.tree.insert(ns, tokens[:n], _slot_array(params.value[:n]))
        return InsertResult(prefix_len=result.prefix_len)

    def checkpoint(self, req: Req, *, up_to: int, **_kwargs: Any) -> None:
        """Insert the request's KV ``[0, up_to)`` and re-anchor its lock (see module doc)."""
        if self.disable:
            return
        token_ids = req.full_untruncated_fill_ids[:up_to]
        key = RadixKey(token_ids, req.extra_key, cache_salt=req.cache_salt)
        ns = self._namespace(key)
        tokens = self.tree_key(token_ids) if ns is not None else None
        if ns is None or tokens is None:
            return  # the row keeps its own slots; they are freed when the request is released
        n = len(tokens) - len(tokens) % self.page_size
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        values = row[:n].to(dtype=torch.int64, copy=True)
        result = self.tree.insert(ns, tokens[:n], _slot_array(values))
        if result.duplicate_indices:
            # The request's own slots for tokens the tree already held: not tree slots.
            self.token_to_kv_pool_allocator.free(self._tensor(result.duplicate_indices))
        req.kv.cache_inserted_len = max(req.kv.cache_inserted_len, result.stored_len)

        found = self.tree.match(ns, tokens[: result.stored_len], count=False)
        protected = req.kv.cache_protected_len
        stored = found.prefix_len
        if stored > protected:
            self.req_to_token_pool.write(
                (req.kv.req_pool_idx, slice(protected, stored)),
                self._tensor(found.slots[protected:stored]).to(row.dtype),
            )
        # Slots in [stored, up_to) stay with the request and are freed at release.
        req.kv.cache_protected_len = max(protected, stored)
        if self.page_owners is not None and stored:
            route = self.tree.shared_route(ns, tokens[:stored])
            if route is not None:
                self.page_owners.mark_shared(found.slots[: route[1]].tolist(), route[0])
        new_node = IsoNode(found.last_node, self._tensor(found.slots), ns) if stored else self.root_node
        self.unlock(req.lock)
        req.lock = self.lock(new_node)
        req.last_node = new_node

    def evict(self, params: EvictParams) -> EvictResult:
        if self.disable or params.num_tokens <= 0:
            return EvictResult()
        evicted = self.tree.evict(params.num_tokens)
        self.report.maybe_export()
        return EvictResult(num_tokens_evicted=evicted)

    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        if self.disable or not isinstance(node, IsoNode) or node.handle.is_empty:
            return IncLockRefResult(delta=0)
        before = self.tree.evictable_size()
        self.tree.inc_lock(node.handle)
        return IncLockRefResult(delta=self.tree.evictable_size() - before)

    def dec_lock_ref(self, node: Any, params: DecLockRefParams | None = None) -> DecLockRefResult:
        if self.disable or not isinstance(node, IsoNode) or node.handle.is_empty:
            return DecLockRefResult(delta=0)
        before = self.tree.evictable_size()
        self.tree.dec_lock(node.handle)
        return DecLockRefResult(delta=self.tree.evictable_size() - before)

    def path_device_indices(self, node: Any) -> torch.Tensor:
        return node.indices if isinstance(node, IsoNode) else self._empty_indices

    def root_node_handle(self, extra_key: str | None = None) -> Any:
        return self.root_node

    def dfs_weight_order(self, node_handles: Any) -> list[int]:
        # Scheduling order only; namespaces are disjoint trees, so keep arrival order.
        return list(range(len(node_handles)))

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def evictable_size(self) -> int:
        return self.tree.evictable_size()

    def protected_size(self) -> int:
        # NOTE: the owner check's zero page is taken from the pool for good: it counts as locked cache,
        # so SGLang's idle accounting (available + evictable + protected == total) still balances.
        reserved = self.page_owners.page_size if self.page_owners is not None else 0
        # Likewise pages a PD transfer may still touch, freed by their owner but held back (quarantined).
        if self.pd_guard is not None:
            reserved += self.pd_guard.held_tokens()
        return self.tree.protected_size() + reserved

    def total_size(self) -> int:
        return self.tree.total_size()

    def pretty_print(self) -> None:
        print(f"TenantRadixCache: {self.iso_status()}")

    def take_events(self) -> list[Any]:
        return []

    def check_hicache_events(self) -> None:
        return None  # the host tier has no asynchronous transfers to acknowledge

    def ready_to_load_host_cache(self) -> int:
        return -1  # no asynchronous load-back: host hits are already on the device when matched

    def clear_storage_backend(self) -> bool:
        """SGLang's ``/clear_hicache_storage_backend``: every L3 page becomes unreachable."""
        if self.host is not None:
            self.host.forget_owner("*")
        return True

    # ------------------------------------------------------------------------------------------ sglang-iso API

    def iso_status(self) -> dict[str, Any]:
        """A JSON-safe summary for /get_server_info and the startup check (see :class:`CacheReport`)."""
        return self.report.status()

    def tenant_stats(self) -> dict[str, dict[str, int | None]]:
        """Per-owner totals over its namespaces (tokens), for ``GET /iso/tenants`` (see :class:`CacheReport`)."""
        return self.report.tenant_stats()

    def namespaces(self) -> list[str]:
        """Namespaces seen so far (configured on first use), sorted."""
        return sorted(self._configured)

    def readable_shared(self, ns: str | None) -> list[str]:
        return self.tree.readable_shared(ns) if ns is not None else []

    def check_integrity(self) -> bool:
        """Run the tree's invariant check; False (logged) on any failure."""
        try:
            self.tree.check_integrity()
        except AssertionError as exc:
            logger.error("sglang-iso: tree integrity check failed: %s", exc)
            return False
        return True

    def flush_owner(self, owner: str) -> int:
        """Drop every unlocked entry of ``owner``'s namespaces (``"*"``: every namespace); returns tokens released."""
        receipt = self.erase_owner(owner, scrub_now=False)
        return receipt["device_tokens_dropped"] + receipt["host_tokens_dropped"]

    def erase_owner(self, owner: str, *, scrub_now: bool = True) -> dict[str, int]:
        """Drop every copy of ``owner``'s cache (``"*"``: everyone's) in every tier; returns what each held.

        Device entries a running request holds stay until it ends (``device_tokens_held``); freed device pages are
        zeroed now with ``scrub_now`` (else at the next hand-out, as always); host pages are zeroed as they drop;
        the owner's L3 files become unreadable (new key epoch) and those this server knows are deleted. On a PD
        worker, pages a transfer of the owner still fences (``pd_pages_fenced``) are zeroed when it lets go of them
        (drained, or reclaimed by the operator); until then the erase is not complete.
        """
        l3_files = self.host.forget_owner(owner) if self.host is not None else 0
        device = host = held = 0
        for ns in list(self._configured.values()):
            if owner == "*" or ns.tenant == owner:
                device += self.tree.flush(ns.key)
                host += self.host.flush(ns.key) if self.host is not None else 0
                held += self.tree.stats(ns.key).resident  # locked by running requests: they stay
        scrubbed = self.scrubber.flush() if scrub_now and self.scrubber is not None else 0
        return {
            "device_tokens_dropped": device,
            "device_pages_scrubbed": scrubbed,
            "device_tokens_held": held,
            "host_tokens_dropped": host,
            "l3_files_deleted": l3_files,
            "pd_pages_fenced": self.pd_guard.quarantine.owner_pages(owner) if self.pd_guard is not None else 0,
        }

    def flush_adapter(self, lora_id: str) -> int:
        """Drop every unlocked entry computed with adapter load ``lora_id``; returns tokens released."""
        return sum(self._flush_ns(ns.key) for ns in list(self._configured.values()) if ns.adapter == lora_id)

    def _flush_ns(self, ns: str) -> int:
        """Drop ``ns``'s unlocked device entries and all its host pages (scrubbed); returns tokens released."""
        return self.tree.flush(ns) + (self.host.flush(ns) if self.host is not None else 0)

    # ------------------------------------------------------------------------------------------ private

    def _release_slots(self, slots: array) -> None:
        """The only path by which slots leave the tree for the allocator."""
        if slots:
            self.token_to_kv_pool_allocator.free(self._tensor(slots))

    def tree_key(self, tokens: Sequence[int]) -> Sequence[int] | None:
        """The tree's key for ``tokens``: the tokens, or their packed pairs with an EAGLE-style draft head
        (None, a miss, when a token cannot be packed; the scheduler's checks refuse such tokens first)."""
        if not self.pair_keys:
            return tokens if isinstance(tokens, list | array) else list(tokens)
        try:
            return pair_key(tokens)
        except ValueError as exc:
            logger.warning("sglang-iso: token ids the pair key cannot hold; treated as a miss: %s", exc)
            return None

    def _lookup(self, key: RadixKey) -> tuple[str, Sequence[int]] | None:
        """(namespace, tree key) of a lookup, or None when it can only miss (cache off, no namespace, under a
        page, or tokens the pair key cannot hold)."""
        ns = self._namespace(key)
        tokens = self.tree_key(key.token_ids[: len(key)]) if ns is not None and not self.disable else None
        if ns is None or tokens is None or len(tokens) < self.page_size:
            return None
        return ns, tokens

    def namespace_of_request(self, extra_key: str | None, cache_salt: str | None) -> str | None:
        """The tree namespace of a request with these fields (its verified tag), configuring it on first sight;
        None when the tag does not verify (counted by the resolver: such a request shares nothing)."""
        return self._namespace(RadixKey([], extra_key, cache_salt=cache_salt))

    def _namespace(self, key: RadixKey) -> str | None:
        ns = self.resolver.resolve_namespace(key.extra_key, key.cache_salt)
        if ns is None:
            return None
        if ns.key not in self._configured:
            self._configure(ns)
        return ns.key

    def namespace_of(self, key: str) -> Namespace | None:
        """The namespace the resolver made for tree namespace ``key`` (None: not a configured one)."""
        return self._configured.get(key)

    def _configure(self, namespace: Namespace) -> None:
        ns, owner, lora_id = namespace.key, namespace.tenant, namespace.adapter
        # NOTE: a LoRA namespace gets its own KV scope, because operator-shared prefixes hold base-model KV.
        scope = SHARED_SCOPE if lora_id is None else f"lora:{lora_id}"
        self.tree.register_namespace(ns, tenant_id=owner or "open", scope=scope)
        settings = self.policies.get(owner) if owner is not None else None
        if settings is not None:
            self.tree.set_quota(ns, settings.quota_tokens)
            self.tree.set_policy(ns, settings.policy)
            if self.host is not None:
                # NOTE: one host cap over all of the owner's namespaces (base model and each adapter)
                self.host.tier.set_quota(ns, settings.host_quota_tokens, group=owner)
        self._configured[ns] = namespace

    def _tensor(self, values: Any) -> torch.Tensor:
        if type(values) is array and values.typecode == "q" and values:
            # NOTE: a copy of the tree's buffer (no per-slot Python objects); the tree never writes it in place.
            return torch.frombuffer(values, dtype=torch.int64).to(self.device, copy=True)
        return torch.tensor(list(values), dtype=torch.int64, device=self.device)

    def _miss(self) -> MatchResult:
        return MatchResult(
            device_prefix_len=0,
            last_device_node=self.root_node,
            last_host_node=self.root_node,
            best_match_node=self.root_node,
        )


def _slot_array(slots: torch.Tensor) -> array:
    """An integer tensor of slots as the tree's ``array('q')``, through its bytes (no per-slot Python objects)."""
    out = array("q")
    out.frombytes(slots.to(device="cpu", dtype=torch.int64).contiguous().numpy().tobytes())
    return out
