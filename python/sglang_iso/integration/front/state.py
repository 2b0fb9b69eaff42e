"""The front end's tenant state: one :class:`FrontState` per HTTP process, made when the gate is installed."""

from __future__ import annotations

from typing import Any

from sglang_iso.integration.front import metrics
from sglang_iso.server.adapters import AdapterVersions
from sglang_iso.server.rate_limits import RateLimiter
from sglang_iso.server.retention import Retention, policies
from sglang_iso.server.tagging import NamespaceTagger, fingerprint_dir
from sglang_iso.tenancy.config import TenantsConfig


class FrontState:
    """Current tenants config and namespace tagger of this HTTP process.

    Mutated only on the HTTP process's main thread: by the SIGHUP handler (:meth:`replace_config`) and
    after a weight update (:meth:`bump_weights`); request handlers read :attr:`tagger` once per request.
    """

    def __init__(self, config: TenantsConfig, server_args: Any) -> None:
        self.config = config
        """The tenants config in force (replaced by a successful reload)."""
        self.server_args = server_args
        """SGLang's ``ServerArgs`` (model path, KV dtype, page size): part of every namespace identity."""
        self.weights_generation = 0
        """Bumped after every weight update: part of the model fingerprint, so old entries never match."""
        self.tagger = self._make_tagger()
        """Tags requests for :attr:`config` and the current weights."""
        metrics.init_tenant_series(list(config.tenants))
        self.served: dict[str, dict[str, int]] = {}
        """Tenant -> ``requests``, ``prompt_tokens`` and ``cached_tokens`` its finished requests were served (counted
        from the outputs this process sent; mutated by the request handlers on the event loop)."""
        self.rates: RateLimiter | None = None
        """The gate's per-tenant rate limits (set when the gate is installed), for the admin API."""
        self.retention = Retention(policies(config))
        """Each owner's retention limits and request activity (:mod:`sglang_iso.server.retention`)."""
        self.removed_owners: set[str] = set()
        """Owners (tenants, groups) a reload removed whose caches are still to be erased (by the sweeper)."""
        self.sweeper: Any = None
        """The task dropping expired caches (started with the server's event loop)."""
        self.adapter_versions = AdapterVersions()
        """The content version of each loaded adapter (:mod:`sglang_iso.integration.lora`): part of the tag of a
        request naming it."""
        self.internal_key: str | None = None
        """The key of this process's calls to itself (the gate's ``internal_key``; set when the gate is installed,
        kept in memory only)."""

    def replace_config(self, config: TenantsConfig) -> None:
        """A reloaded tenants file takes effect for new requests; owners it no longer has get their caches erased."""
        old_owners = {t.group or t.id for t in self.config.tenants.values()}
        self.removed_owners |= old_owners - {t.group or t.id for t in config.tenants.values()}
        self.config = config
        self.tagger = self._make_tagger()
        self.retention.replace_limits(policies(config))
        metrics.init_tenant_series(list(config.tenants))

    def bump_weights(self) -> None:
        """The model's weights changed: every later tag names a new namespace."""
        self.weights_generation += 1
        self.tagger = self._make_tagger()

    def _make_tagger(self) -> NamespaceTagger:
        server_args = self.server_args
        model_path = getattr(server_args, "model_path", None)
        tokenizer_path = getattr(server_args, "tokenizer_path", None) or model_path
        model_fp = fingerprint_dir(model_path, "config.json", "model.safetensors", "model.safetensors.index.json")
        revision = getattr(server_args, "revision", None)
        if revision:
            model_fp = f"{model_fp}@{revision}"
        model_fp = f"{model_fp}#weights{self.weights_generation}"
        return NamespaceTagger(
            self.config,
            model_fingerprint=model_fp,
            tokenizer_fingerprint=fingerprint_dir(tokenizer_path, "tokenizer.json", "tokenizer_config.json"),
            kv_dtype=str(getattr(server_args, "kv_cache_dtype", None) or "auto"),
            page_size=int(getattr(server_args, "page_size", None) or 1),
        )


# NOTE: module-level because SGLang calls our hooks as plain functions; set once, by the gate install.
_CURRENT: FrontState | None = None


def current() -> FrontState | None:
    """This process's state; None until the gate is installed (and always outside the HTTP process)."""
    return _CURRENT


def set_current(state: FrontState) -> None:
    global _CURRENT
    _CURRENT = state
