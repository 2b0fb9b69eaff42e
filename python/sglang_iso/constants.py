"""Constants more than one floor of sglang-iso needs: one home each. Imports nothing from sglang-iso."""

from __future__ import annotations

from typing import Literal

MIN_SECRET_BYTES = 32
"""Shortest accepted namespace secret (HMAC key): 256 bits, the SHA-256 output size."""

CachePolicy = Literal["private", "off"]
CACHE_POLICIES: tuple[CachePolicy, ...] = ("private", "off")
"""``private``: the namespace caches and reuses its own prefixes. ``off``: it never inserts or matches."""

BACKEND_NAME = "tenant"
"""The radix cache backend sglang-iso registers with SGLang (``--radix-cache-backend tenant``)."""

SHARED_NAMESPACE_PREFIX = "shared:"
"""Namespace ids of operator-declared shared prefixes are ``shared:<name>``; tenants may not use it."""
