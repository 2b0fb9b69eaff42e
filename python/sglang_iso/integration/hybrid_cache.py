"""``TenantHybridCache``: the tenant cache for hybrid linear-attention models (Qwen3.5, Qwen3-Next, Nemotron-H, ...)
and for hybrid sliding-window models in SGLang's SWA sub-pool layout (gpt-oss, Laguna, Llama 4, ...).

A hybrid model's prefix is reusable only together with the recurrent state its linear-attention layers had at the
end of it. SGLang keeps those states on tree nodes in its unified tree (``UnifiedRadixCache`` with the Mamba
component: a node's snapshot is a slot of the ``MambaPool``, copied into a matching request's own slot before its
forward, and a finished request's slot is donated to the node its insert ends on). This cache is that tree, with the
tenant rules on top, so the state machinery stays SGLang's own. The same holds for the SWA component (a sliding
layer's KV in its own sub-pool, tombstoned outside the window, matches bounded by it):

* **Namespaces.** SGLang's tree keys every child by ``(extra_key, cache_salt)`` besides its tokens, so each
  ``extra_key`` roots its own subtree. The front end writes a MAC'd namespace tag into ``extra_key``; here it must
  verify (:class:`~sglang_iso.identity.tags.NamespaceResolver`), or the key neither matches nor inserts (at
  ``match_prefix``, ``insert`` and ``checkpoint``): a request without a verified tag shares nothing, like one whose
  tenant has ``cache_policy = "off"``.
* **Ownership tag checked on every match.** Every node carries the key it was inserted under; after the walk, each
  node from the matched one up to the root must carry the request's own ``(extra_key, cache_salt)``, else the match
  becomes a miss before any state or KV of it is handed out (counted, logged: fail closed).
* **Scrub.** Freed KV pages are zeroed by the KV scrubber (one per sub-pool in the SWA layout) and freed state slots
  by :class:`~sglang_iso.integration.mamba_scrub.MambaScrubber` (both set by the factory).
* **Owner check.** The KV owner check sanitizes the rows (full-pool slots) before every forward; in the SWA layout it
  also checks the sliding-window map entries those rows' sliding layers read
  (:mod:`~sglang_iso.integration.swa_owner`), and for linear-attention models each row's state slot
  (:mod:`~sglang_iso.integration.state_owner`).
* **Quotas.** A namespace whose owner has ``quota_tokens`` keeps at most that many resident tokens: after an insert
  over it, the next match or eviction drops the namespace's own least recently used unlocked leaves (KV and state,
  through SGLang's leaf eviction) until it fits (nodes running requests hold stay; counted as
  ``quota_evicted_tokens``). Not inside the insert: its caller may still lock the node it inserted.
* **Reporting.** Per-owner rows (``GET /iso/tenants``) go to the Prometheus series and the audit log as the tenant
  tree's do (:class:`~sglang_iso.integration.cache_report.HybridCacheReport`, throttled, at matches and evictions).
* **Erase.** ``erase_owner`` drops the unlocked nodes of an owner's namespaces (KV pages and state snapshots),
  leaf by leaf through SGLang's own leaf eviction, which frees both.

Not covered here (refused at start, the hybrid rows of :mod:`sglang_iso.coverage`): the host tier and L3 (so their
quotas have nothing to cap), shared prefixes, speculative decoding, PD, streaming sessions, and the extra-buffer
state strategy. Scheduler thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sglang.srt.mem_cache.base_prefix_cache import (
    EvictParams,
    EvictResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from sglang_iso.constants import BACKEND_NAME
from sglang_iso.identity.tags import Namespace, NamespaceResolver
from sglang_iso.integration.cache_report import ROW_COUNTERS, HybridCacheReport

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

    from sglang_iso.integration.fairness import KvShares
    from sglang_iso.integration.mamba_scrub import MambaScrubber
    from sglang_iso.integration.owner_check import OwnerTable
    from sglang_iso.integration.scrub import KvScrubber, SwaScrubber
    from sglang_iso.integration.tenant_cache import TenantPolicy

logger = logging.getLogger(__name__)

Scope = tuple[str | None, str | None]
"""What SGLang's tree keys a namespace by: ``(extra_key, cache_salt)``."""


class TenantHybridCache(UnifiedRadixCache):
    """SGLang's unified tree (full KV + Mamba state snapshots) under the tenant rules (see module doc)."""

    sglang_iso_backend = BACKEND_NAME

    # NOTE: set by :meth:`configure` right after SGLang's own constructor; the factory calls both.
    resolver: NamespaceResolver
    policies: dict[str, TenantPolicy]

    def configure(self, resolver: NamespaceResolver, policies: dict[str, TenantPolicy]) -> TenantHybridCache:
        """Attach the namespace rules (SGLang's factory hook builds the class with its own arguments only)."""
        self.resolver = resolver
        self.policies = dict(policies)
        self._configured: dict[str, Namespace] = {}
        self.scrubber: KvScrubber | SwaScrubber | None = None
        self.mamba_scrubber: MambaScrubber | None = None
        self.page_owners: OwnerTable | None = None
        self.pd_guard: Any = None  # PD is refused with hybrid models; read by the runtime like the tenant cache's
        self.host: Any = None  # no host tier (refused)
        self.kv_shares: KvShares | None = None
        self.erase_receipts: dict[str, dict[str, int]] = {}
        self.counters = {
            "lookups": 0, "lookup_tokens": 0, "hit_tokens": 0, "unverified": 0, "foreign_nodes": 0,
            "quota_evicted_tokens": 0,
        }  # fmt: skip
        self._over_quota: set[Scope] = set()  # scopes inserted into since their quota was last enforced
        self.report = HybridCacheReport(self, BACKEND_NAME)  # type: ignore[arg-type]
        self.owner_counters: dict[str, dict[str, int]] = {}
        return self

    # ------------------------------------------------------------------------------------------ namespace rules

    def namespace_of_request(self, extra_key: str | None, cache_salt: str | None) -> str | None:
        """The namespace of a request with these fields (its verified tag), or None (the owner check's owner)."""
        ns = self.resolver.resolve_namespace(extra_key, cache_salt)
        if ns is None:
            return None
        self._configured.setdefault(ns.key, ns)
        return ns.key

    def _sharing_namespace(self, extra_key: str | None, cache_salt: str | None) -> str | None:
        """The namespace a key may match and insert in: its verified one, unless its owner has the cache off."""
        ns = self.namespace_of_request(extra_key, cache_salt)
        return ns if ns is not None and self._shares(ns) else None

    def _shares(self, ns: str) -> bool:
        policy = self.policies.get(self._configured[ns].owner)
        return policy is None or policy.policy != "off"

    def _quota(self, ns: str) -> int | None:
        policy = self.policies.get(self._configured[ns].owner)
        return None if policy is None else policy.quota_tokens

    def _inserted(self, ns: str, scope: Scope) -> None:
        if self._quota(ns) is not None:
            self._over_quota.add(scope)

    def _enforce_quotas(self) -> None:
        """Bring every namespace inserted into since the last call under its quota (see module doc)."""
        pending, self._over_quota = self._over_quota, set()
        for scope in pending:
            ns = self._sharing_namespace(*scope)
            quota = None if ns is None else self._quota(ns)
            if ns is not None and quota is not None:
                evicted = self._evict_to(scope, quota)
                self.counters["quota_evicted_tokens"] += evicted
                self._row(self._configured[ns].owner)["evicted_tokens"] += evicted

    def _evict_to(self, scope: Scope, quota: int) -> int:
        """Evict ``scope``'s least recently used unlocked leaves until it holds at most ``quota`` tokens (or none is
        left to evict); returns the tokens evicted."""
        tracker = {component: 0 for component in self.tree_components}
        is_leaf = self.tree_core._is_device_leaf
        while True:
            nodes = [node for node in self._scope_nodes(scope) if not node.evicted]
            leaves = [node for node in nodes if is_leaf(node)]
            if sum(len(node.key) for node in nodes) <= quota or not leaves:
                return int(tracker[self.tree_components[0]])
            self._evict_device_leaf(min(leaves, key=lambda node: node.last_access_time).id, tracker)

    def namespace_of(self, key: str) -> Namespace | None:
        """The namespace the resolver made for namespace ``key`` (None: not seen)."""
        return self._configured.get(key)

    def readable_shared(self, ns: str | None) -> list[str]:
        return []  # shared prefixes are refused with hybrid models

    def _row(self, owner: str) -> dict[str, int]:
        return self.owner_counters.setdefault(
            owner, {"lookup_tokens": 0, "lookup_hit_tokens": 0, "evicted_tokens": 0, "violations": 0}
        )

    # ------------------------------------------------------------------------------------------ SGLang hooks

    def _match_tree(self, params: MatchPrefixParams) -> MatchResult:
        """SGLang's walk, limited to the request's verified namespace and checked node by node up to the root."""
        if self.disable:
            return super()._match_tree(params)
        self._enforce_quotas()
        key = params.key
        ns = self.namespace_of_request(key.extra_key, key.cache_salt)
        self.counters["lookups"] += 1
        self.counters["lookup_tokens"] += len(key)
        if ns is None:
            self.counters["unverified"] += 1
        elif not self._shares(ns):
            ns = None  # the owner's cache is off
        if ns is None:
            # An empty key walks nothing; the finalizers still run (the Mamba component gives the request its
            # own fresh slot, as on any miss).
            params = replace(params, key=RadixKey([], key.extra_key, cache_salt=key.cache_salt))
        foreign: str | None
        try:
            result = self.tree_core.match_prefix(params)
        except ValueError as exc:  # SGLang's walk met a node keyed for another namespace (a corrupted child table)
            result, foreign = self.tree_core.empty_match_result, str(exc)
        else:
            self._apply_cache_actions(result.cache_actions)
            found = self._foreign_node(result, (key.extra_key, key.cache_salt)) if ns is not None else None
            foreign = None if found is None else f"node {found}"
        if foreign is not None:
            self.counters["foreign_nodes"] += 1
            if ns is not None:
                self._row(self._configured[ns].owner)["violations"] += 1
            logger.error(
                "sglang-iso: isolation violation: a match of namespace %s reached another namespace (%s); "
                "served as a miss",
                ns,
                foreign,
            )
            result = self.tree_core.empty_match_result
        if ns is not None:
            row = self._row(self._configured[ns].owner)
            row["lookup_tokens"] += len(key)
            row["lookup_hit_tokens"] += int(result.device_prefix_len)
            self.counters["hit_tokens"] += int(result.device_prefix_len)
        self.report.maybe_export()
        return self._finalize_match_result(params, result)

    def _foreign_node(self, result: MatchResult, scope: Scope) -> int | None:
        """The id of a node on a matched path whose key is not under ``scope`` (None: every node is)."""
        for node_id in {result.last_device_node, result.last_host_node, result.best_match_node}:
            node = self.tree_core.node_by_id(node_id)
            while node is not None and node.parent is not None:  # the root carries no key
                node_key = node.key
                if node_key is None or (node_key.extra_key, node_key.cache_salt) != scope:
                    return int(node.id)
                node = node.parent
        return None

    def insert(self, params: InsertParams) -> InsertResult:
        """SGLang's insert, for keys of a verified namespace only: any other key stores nothing (the caller keeps
        its KV and state)."""
        key = params.key
        if self.disable:
            return super().insert(params)
        ns = None if key is None else self._sharing_namespace(key.extra_key, key.cache_salt)
        if key is None or ns is None:
            return InsertResult(prefix_len=0)
        result = super().insert(params)
        self._inserted(ns, (key.extra_key, key.cache_salt))
        return result

    def evict(self, params: EvictParams) -> EvictResult:
        """SGLang's eviction, after the namespaces over their quota gave back their excess."""
        self._before_evict()
        return super().evict(params)

    def evict_for_alloc(self, params: EvictParams, **kwargs: Any) -> EvictResult:
        """SGLang's eviction for an allocation, after the namespaces over their quota gave back their excess."""
        self._before_evict()
        return super().evict_for_alloc(params, **kwargs)

    def _before_evict(self) -> None:
        if not self.disable:
            self._enforce_quotas()
            self.report.maybe_export()

    def checkpoint(self, req: Req, *, up_to: int, **kwargs: Any) -> None:
        """SGLang's insert, for requests of a verified namespace only; any other request keeps its own KV and
        state, which its release frees (and the scrubbers zero)."""
        ns = None if self.disable else self._sharing_namespace(req.extra_key, req.cache_salt)
        if self.disable or ns is not None:
            super().checkpoint(req, up_to=up_to, **kwargs)
            if ns is not None:
                self._inserted(ns, (req.extra_key, req.cache_salt))
            return
        if req.finished():
            for component in self._components_tuple:
                component.cleanup_after_caching_req(req, is_finished=True)

    def protected_size(self) -> int:
        return super().protected_size() + self._reserved()

    def full_protected_size(self) -> int:
        return super().full_protected_size() + self._reserved()

    def mamba_protected_size(self) -> int:
        state = self.page_owners.state if self.page_owners is not None else None
        return super().mamba_protected_size() + (state.reserved if state is not None else 0)

    def swa_protected_size(self) -> int:
        swa = self.page_owners.swa if self.page_owners is not None else None
        return super().swa_protected_size() + (swa.reserved if swa is not None else 0)

    def _reserved(self) -> int:
        # NOTE: the owner check's zero page is taken from the pool for good: it counts as locked cache, so SGLang's
        # idle accounting (available + evictable + protected == total) still balances.
        return self.page_owners.page_size if self.page_owners is not None else 0

    # ------------------------------------------------------------------------------------------ sglang-iso API

    def _nodes(self) -> Iterator[tuple[Any, Scope]]:
        """Every node but the root with the scope of its root child, children before parents."""
        stack: list[tuple[Any, Scope, bool]] = [
            (child, (child.key.extra_key, child.key.cache_salt) if child.key is not None else (None, None), False)
            for child in self.tree_core.root_node.children.values()
        ]
        while stack:
            node, scope, expanded = stack.pop()
            if expanded:
                yield node, scope
                continue
            stack.append((node, scope, True))
            stack.extend((child, scope, False) for child in node.children.values())

    def _scope_nodes(self, scope: Scope) -> Iterator[Any]:
        """Every node of ``scope``'s subtrees (only those: the root's children keyed by it, and below)."""
        stack = [
            child
            for child in self.tree_core.root_node.children.values()
            if child.key is not None and (child.key.extra_key, child.key.cache_salt) == scope
        ]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _scopes(self) -> dict[Scope, Namespace | None]:
        """The namespace of every scope rooted in the tree (None: one that does not verify; none is inserted)."""
        return {
            scope: self.resolver.resolve_namespace(*scope)
            for scope in {(c.key.extra_key, c.key.cache_salt) for c in self.tree_core.root_node.children.values()}
        }

    def _drop(self, owns: Callable[[Namespace], bool]) -> tuple[int, int]:
        """Evict every unlocked node of the namespaces ``owns`` accepts (KV and state); returns (tokens dropped,
        tokens held by running requests)."""
        chosen = {scope for scope, ns in self._scopes().items() if ns is not None and owns(ns)}
        tracker = {component: 0 for component in self.tree_components}
        is_leaf = self.tree_core._is_device_leaf
        progress = True
        while progress:  # a parent becomes a leaf once its children are gone
            progress = False
            for node, scope in list(self._nodes()):
                if scope in chosen and is_leaf(node):
                    self._evict_device_leaf(node.id, tracker)
                    progress = True
        held = sum(len(node.key) for node, scope in self._nodes() if scope in chosen and not node.evicted)
        return int(tracker[self.tree_components[0]]), held

    def erase_owner(self, owner: str, *, scrub_now: bool = True) -> dict[str, int]:
        """Drop ``owner``'s cache (``"*"``: everyone's): KV pages and state snapshots of its unlocked nodes.

        Nodes a running request holds stay until it ends (``device_tokens_held``); freed pages are zeroed now with
        ``scrub_now`` (state slots at their next hand-out, as always).
        """
        dropped, held = self._drop(lambda ns: owner == "*" or ns.owner == owner)
        scrubbed = self.scrubber.flush() if scrub_now and self.scrubber is not None else 0
        return {
            "device_tokens_dropped": dropped,
            "device_pages_scrubbed": scrubbed,
            "device_tokens_held": held,
            "host_tokens_dropped": 0,
            "l3_files_deleted": 0,
            "pd_pages_fenced": 0,
        }

    def flush_owner(self, owner: str) -> int:
        """Drop every unlocked entry of ``owner``'s namespaces (``"*"``: every namespace); returns tokens released."""
        return self.erase_owner(owner, scrub_now=False)["device_tokens_dropped"]

    def flush_adapter(self, lora_id: str) -> int:
        """Drop every unlocked entry computed with adapter load ``lora_id`` (LoRA is not served with hybrid
        models, so there is none); returns tokens released."""
        return self._drop(lambda ns: ns.adapter == lora_id)[0]

    def check_integrity(self) -> bool:
        """Every node carries its root child's scope, and every rooted scope verifies; False (logged) otherwise."""
        scopes = self._scopes()
        for node, scope in self._nodes():
            if node.key is None or (node.key.extra_key, node.key.cache_salt) != scope or scopes.get(scope) is None:
                logger.error("sglang-iso: tree integrity check failed at node %s", node.id)
                return False
        return True

    def iso_status(self) -> dict[str, Any]:
        """A JSON-safe summary for /get_server_info and the startup check (the tenant tree's fields, plus the state
        pool's and its scrubber's)."""
        allocator = self.token_to_kv_pool_allocator
        state_pool = getattr(self.req_to_token_pool, "mamba_pool", None)
        return {
            "backend": BACKEND_NAME,
            "impl": type(self).__name__,
            "page_size": self.page_size,
            "kv_pool": type(allocator.get_kvcache()).__name__,
            "state_pool": None if state_pool is None else type(state_pool).__name__,
            "disabled": self.disable,
            "namespace_mode": self.resolver.mode,
            "namespaces": len(self._configured),
            "evictable_tokens": self.evictable_size(),
            "protected_tokens": self.protected_size(),
            "violations": self.counters["foreign_nodes"],
            "rejected_tags": self.resolver.rejected_tags,
            "untagged_lookups": self.resolver.untagged,
            "kv_scrub": "off" if self.scrubber is None else "on-free",
            "state_scrub": "off" if self.mamba_scrubber is None else "on-free",
            "kv_owner_check": "off" if self.page_owners is None else "on",
            "owner_violations": 0,
            **({} if self.page_owners is None else self.page_owners.status()),
            **({} if self.scrubber is None else self.scrubber.status()),
            **({} if self.mamba_scrubber is None else self.mamba_scrubber.status()),
            **{f"hybrid_{name}": value for name, value in self.counters.items()},
        }

    def tenant_stats(self) -> dict[str, dict[str, int | None]]:
        """Per-owner rows for ``GET /iso/tenants`` (and the Prometheus series and audit events of
        :class:`~sglang_iso.integration.cache_report.HybridCacheReport`): resident tokens of its nodes (evictable, or
        protected by a running request's lock), its per-namespace quota, lookups and hits, tokens its quota evicted,
        foreign nodes its matches met."""
        rows: dict[str, dict[str, int | None]] = {}
        scopes = self._scopes()
        for node, scope in self._nodes():
            ns = scopes.get(scope)
            if ns is not None and not node.evicted:
                row = rows.setdefault(ns.owner, dict.fromkeys(ROW_COUNTERS, 0))
                locked = any(data.lock_ref > 0 for data in node.component_data)
                field = "protected_tokens" if locked else "evictable_tokens"
                for name in ("resident_tokens", field):
                    row[name] = (row[name] or 0) + len(node.key)
        for owner, counts in self.owner_counters.items():
            row = rows.setdefault(owner, dict.fromkeys(ROW_COUNTERS, 0))
            row.update(counts)
        for owner, row in rows.items():
            policy = self.policies.get(owner)
            row["quota_tokens_per_namespace"] = None if policy is None else policy.quota_tokens
            row["namespaces"] = sum(1 for ns in scopes.values() if ns is not None and ns.owner == owner)
        return rows
