"""The ``tenant`` radix cache backend as SGLang's scheduler sees it.

``TenantRadixCache`` is what ``--radix-cache-backend tenant`` builds. At this
stage it keeps upstream's tree core unchanged (a pass-through subclass of
``UnifiedRadixCache``) and adds identification, so the scheduler-side check can
prove the live tree cache is ours. The tenant-partitioned tree replaces its
matching and insertion logic without changing how it is registered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sglang.srt.mem_cache.registry import create_unified_radix_cache
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_iso.integration.symbols import REQUIRED_HOOK_TARGETS

if TYPE_CHECKING:
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext

logger = logging.getLogger(__name__)

BACKEND_NAME = "tenant"


class TenantRadixCache(UnifiedRadixCache):
    """The tree cache sglang-iso serves with (registered as ``tenant``)."""

    sglang_iso_backend = BACKEND_NAME

    def iso_status(self) -> dict[str, Any]:
        """A JSON-safe summary for /get_server_info and the startup check."""
        return {
            "backend": BACKEND_NAME,
            "impl": type(self).__name__,
            "page_size": int(getattr(self, "page_size", 1)),
            "disabled": bool(getattr(self, "disable", False)),
            "evictable_tokens": int(self.evictable_size()),
            "protected_tokens": int(self.protected_size()),
        }


def build_tenant_cache(ctx: TreeCacheBuildContext) -> BasePrefixCache:
    """Factory registered under ``tenant``; runs in the scheduler process.

    Raises:
        RuntimeError: if a hook sglang-iso needs to verify this process was not
            applied (SGLang logs and skips failing hooks; we refuse instead).
    """
    missing = [t for t in REQUIRED_HOOK_TARGETS if t not in HookRegistry._patched]
    if missing:
        raise RuntimeError(f"sglang-iso: required hooks were not applied in the scheduler process: {missing}")
    cache = create_unified_radix_cache(ctx, cache_class=TenantRadixCache)
    logger.info("sglang-iso: tenant tree cache built (%s)", type(cache).__name__)
    return cache
