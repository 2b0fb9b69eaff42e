"""Registering the ``tenant`` backend and sglang-iso's hooks with SGLang (called by the plugin)."""

from __future__ import annotations

import logging

from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

from sglang_iso.constants import BACKEND_NAME
from sglang_iso.integration import hook_table
from sglang_iso.integration.backend import build_tenant_cache

logger = logging.getLogger(__name__)


def install() -> None:
    """Register the backend and every hook once per process (later calls do nothing)."""
    if get_radix_cache_factory(BACKEND_NAME) is not None:
        return
    register_radix_cache_backend(BACKEND_NAME, build_tenant_cache)
    hook_table.install()
    logger.info("sglang-iso: registered radix cache backend %r", BACKEND_NAME)
