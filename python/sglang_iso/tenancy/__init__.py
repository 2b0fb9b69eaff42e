"""Tenancy: the tenants file (``--tenants-file``), API keys, and the operator commands for both.

* :mod:`~sglang_iso.tenancy.config` -- load and validate the tenants file into frozen dataclasses.
* :mod:`~sglang_iso.tenancy.secret` -- read the namespace secret (hex, base64 or raw) from a file or env var.
* :mod:`~sglang_iso.tenancy.keys` -- mint and hash keys; resolve ``Authorization: Bearer`` to a principal.
* :mod:`~sglang_iso.tenancy.operator_commands` -- ``sglang-iso keys ...`` and ``sglang-iso check-config FILE``.
* ``_locate`` / ``_validate`` -- private helpers: line numbers for errors, typed field checks.
"""

from __future__ import annotations

from sglang_iso.tenancy.config import (
    ALL_TENANTS,
    PrefixMessage,
    SharedPrefix,
    Tenant,
    TenantsConfig,
    load_tenants_file,
)
from sglang_iso.tenancy.errors import ConfigError
from sglang_iso.tenancy.keys import KeyIndex, Principal, key_sha256, new_api_key, parse_bearer

__all__ = [
    "ALL_TENANTS",
    "ConfigError",
    "KeyIndex",
    "PrefixMessage",
    "Principal",
    "SharedPrefix",
    "Tenant",
    "TenantsConfig",
    "key_sha256",
    "load_tenants_file",
    "new_api_key",
    "parse_bearer",
]
