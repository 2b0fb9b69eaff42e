"""Front-end side of namespacing: the tag a tenant's request carries to the scheduler.

The tag is computed here, from the authenticated tenant and the server's cache
identity, and overwrites whatever ``extra_key`` the request had. The client's
``cache_salt`` only sub-partitions its own tenant (it is part of the identity).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from pathlib import Path

from sglang_iso.identity import CacheIdentity, NamespaceKeyer
from sglang_iso.identity.tags import make_tag
from sglang_iso.tenancy.config import TenantsConfig

_GROUP_KEY_DOMAIN = b"sglang-iso/group-namespace-key/v1"
_TAG_CACHE_SIZE = 4096
"""Tags remembered per tagger (tenant, salt, adapter): a reload makes a new tagger, so none outlives its config."""
_TAG_CACHE_MAX_SALT = 256
"""Characters of a ``cache_salt`` still remembered: a longer one (the client's choice) is computed each time, so the
memory holds at most ``_TAG_CACHE_SIZE`` short keys, not megabytes of salts."""


def fingerprint_dir(path: str | None, *names: str) -> str:
    """SHA-256 over the named files of a model or tokenizer directory (and its path)."""
    h = hashlib.sha256((path or "").encode())
    if path and Path(path).is_dir():
        for name in names:
            f = Path(path) / name
            if f.is_file():
                h.update(name.encode() + b"\x00" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


class NamespaceTagger:
    """Computes namespace tags for one server's cache identity. Immutable."""

    def __init__(
        self,
        config: TenantsConfig,
        *,
        model_fingerprint: str,
        tokenizer_fingerprint: str,
        kv_dtype: str,
        page_size: int,
    ) -> None:
        self.config = config
        self._keyer = NamespaceKeyer(config.secret)
        # NOTE: group namespaces use a derived key, because a group name may equal a tenant id.
        self._group_keyer = NamespaceKeyer(hmac.new(config.secret, _GROUP_KEY_DOMAIN, hashlib.sha256).digest())
        self._model = model_fingerprint
        self._tokenizer = tokenizer_fingerprint
        self._kv_dtype = kv_dtype
        self._page_size = page_size
        # NOTE: two HMACs per request otherwise (about 13 us); bounded, because the salt is the client's.
        self._tag = functools.lru_cache(maxsize=_TAG_CACHE_SIZE)(self._compute)

    def tag(
        self, tenant_id: str, *, cache_salt: str | None, adapter: str | None, adapter_version: str | None = None
    ) -> str | None:
        """The ``extra_key`` for a request of ``tenant_id``; None for an unknown tenant (no sharing).

        Members of a cache group get the group's tag, so they share one namespace.
        ``adapter`` and ``adapter_version`` (the content hash of its files) name the
        request's LoRA adapter; None for the base model.
        """
        if cache_salt is not None and len(cache_salt) > _TAG_CACHE_MAX_SALT:
            return self._compute(tenant_id, cache_salt, adapter, adapter_version)
        return self._tag(tenant_id, cache_salt, adapter, adapter_version)

    def _compute(
        self, tenant_id: str, cache_salt: str | None, adapter: str | None, adapter_version: str | None
    ) -> str | None:
        tenant = self.config.tenants.get(tenant_id)
        if tenant is None:
            return None
        owner, keyer = (tenant.group, self._group_keyer) if tenant.group else (tenant.id, self._keyer)
        identity = CacheIdentity(
            tenant_id=owner,
            model_fingerprint=self._model,
            tokenizer_fingerprint=self._tokenizer,
            adapter_id=adapter,
            adapter_version=adapter_version if adapter is not None else None,
            kv_dtype=self._kv_dtype,
            page_size=self._page_size,
            cache_salt=cache_salt,
        )
        return make_tag(self.config.secret, owner, keyer.namespace_id(identity))
