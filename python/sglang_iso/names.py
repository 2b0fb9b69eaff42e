"""Name rules for tenants, cache groups, shared prefixes and adapters: one set, used by every layer.

The tenants-file loader (and so ``sglang-iso check-config``), the cache identity, the namespace tags
and the tree all check names with these rules, so a name the loader accepts is never refused later
in the scheduler. Imports nothing from sglang-iso.
"""

from __future__ import annotations

import re

TENANT_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
"""A tenant id must fully match this (lowercase, digits, dashes; 1-64 chars). Never contains ``.`` or ``:``,
which the namespace tag and the tree's namespace ids use as separators."""

GROUP_NAME_PATTERN = TENANT_ID_PATTERN
"""Names after ``group:`` follow the tenant id rule."""

SHARED_PREFIX_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""Shared prefix names as written in the tenants file: ASCII letters, digits, ``.``, ``_``, ``-``; 1-64 chars.
Case does not distinguish two names: the tree keys a prefix by :func:`shared_prefix_key`."""

ADAPTER_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
"""LoRA adapter names a tenant may be allowed: letters, digits, ``.``, ``_``, ``/``, ``-``; 1-128 chars."""


def is_valid_tenant_id(tenant_id: object) -> bool:
    """True if ``tenant_id`` is a str fully matching :data:`TENANT_ID_PATTERN`."""
    return isinstance(tenant_id, str) and TENANT_ID_PATTERN.fullmatch(tenant_id) is not None


def is_valid_shared_prefix_name(name: object) -> bool:
    """True if ``name`` is a str fully matching :data:`SHARED_PREFIX_NAME_PATTERN`."""
    return isinstance(name, str) and SHARED_PREFIX_NAME_PATTERN.fullmatch(name) is not None


def shared_prefix_key(name: str) -> str:
    """The tree's key of shared prefix ``name``: its lowercase form (``Bot`` and ``bot`` are one prefix)."""
    return name.lower()


def is_shared_prefix_key(key: object) -> bool:
    """True if ``key`` is a valid shared prefix name already in its key form (lowercase)."""
    return is_valid_shared_prefix_name(key) and isinstance(key, str) and key == shared_prefix_key(key)
