"""The tenants file (``--tenants-file PATH``): principals, their API keys, cache policy and shared prefixes.

Format (TOML)::

    namespace_secret_file = "secret.key"   # or namespace_secret_env = "SGLANG_ISO_SECRET"
    default_cache_ttl_seconds = 3600         # optional: cache_ttl_seconds of tenants that set none
    default_cache_max_age_seconds = 604800   # optional: cache_max_age_seconds of tenants that set none
    admin_key_sha256 = ["<sha256 hex of an admin key>"]        # optional
    router_key_sha256 = ["<sha256 hex of the PD router's key>"] # optional: may set bootstrap_* fields

    [[tenants]]                              # at least one
    id = "acme"                              # [a-z0-9][a-z0-9-]{0,63}
    key_sha256 = ["<sha256 hex of an API key>"]                # at least one
    quota_tokens = 200000                    # optional positive int: resident cached tokens (device)
    host_quota_tokens = 400000               # optional positive int: tokens in the host tier (L2), all its
                                             # namespaces together; default: quota_tokens (none: no cap)
    l3_quota_tokens = 4000000                # optional positive int: tokens in L3 storage; default: no cap
                                             # but the server's --iso-l3-max-gb; over it, its own oldest go
    cache = "private"                        # "private" | "off" | "group:<name>"; default "private"
    max_concurrent_requests = 8              # optional positive int: requests in flight (default: half the
                                             # server's --max-running-requests, else 32); beyond -> queue
    max_queued_requests = 16                 # optional positive int: requests that wait at the gate for a slot
                                             # (first come first served); default none: beyond -> 429 at once
    requests_per_minute = 600                # optional positive int; default: no limit; beyond -> 429
    tokens_per_minute = 200000               # optional positive int: prompt + output budget per minute, settled
                                             # with the served count; default: no limit; beyond -> 429
    adapters = ["acme-support"]              # optional: LoRA adapters it may use; default none (base model only)
    cache_ttl_seconds = 900                  # optional positive int: idle retention; with no request of the tenant
                                             # for this long, its cache is dropped in every tier (scrubbed);
                                             # default: default_cache_ttl_seconds, else none
    cache_max_age_seconds = 86400            # optional positive int: absolute lifetime; at most this long after
                                             # its first use, the tenant's cache is dropped whatever its traffic;
                                             # default: default_cache_max_age_seconds, else none

    [[shared_prefixes]]                      # optional
    name = "support-bot-v1"
    text = "You are ..."                     # or messages = [{role = "system", content = "..."}]
    tenants = ["acme", "globex"]             # or ["*"]

``namespace_secret_file`` is resolved relative to the tenants file's folder; see
:mod:`sglang_iso.tenancy.secret` for the accepted encodings (hex, base64, raw).
Every key hash maps to exactly one principal (a tenant or the admin role).
Loading validates everything and returns immutable objects; nothing is cached.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sglang_iso.constants import CACHE_POLICIES, CachePolicy
from sglang_iso.names import (
    ADAPTER_NAME_PATTERN,
    GROUP_NAME_PATTERN,
    SHARED_PREFIX_NAME_PATTERN,
    TENANT_ID_PATTERN,
    is_valid_shared_prefix_name,
    is_valid_tenant_id,
    shared_prefix_key,
)
from sglang_iso.tenancy._locate import LineLocator
from sglang_iso.tenancy._validate import KEY_HASH_PATTERN, Validator
from sglang_iso.tenancy.errors import ConfigError
from sglang_iso.tenancy.secret import SecretError, read_secret_env, read_secret_file

__all__ = [
    "ALL_TENANTS",
    "KEY_HASH_PATTERN",
    "AllTenants",
    "ConfigError",
    "PrefixMessage",
    "SharedPrefix",
    "Tenant",
    "TenantsConfig",
    "load_tenants_file",
]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project's CI runs 3.11+
    import tomli as tomllib

"""``private``: the tenant's (or its group's) own namespace; ``off``: never read or write the cache."""

AllTenants = Literal["*"]
ALL_TENANTS: AllTenants = "*"
"""Reader list of a shared prefix that every tenant may use."""

DEFAULT_KV_SHARE = 0.5
"""``kv_share`` of a tenant that sets none, when the file sets no ``default_kv_share`` and has two owners or more."""

_VALID_POLICIES = ", ".join(f'"{p}"' for p in CACHE_POLICIES)


@dataclass(frozen=True)
class Tenant:
    """One tenant. Immutable; built only by :func:`load_tenants_file`."""

    id: str
    """Tenant id, matches ``TENANT_ID_PATTERN``; the cache identity's ``tenant_id``."""
    key_hashes: frozenset[str]
    """SHA-256 hex digests of the tenant's API keys (non-empty)."""
    quota_tokens: int | None
    """Cap on this tenant's resident cached tokens (positive); ``None`` = no per-tenant cap."""
    cache_policy: CachePolicy
    """Whether the tenant uses the prefix cache at all (``group:`` entries parse to ``private``)."""
    group: str | None
    """Cache-sharing group: tenants with the same group read each other's entries; ``None`` = alone."""
    max_concurrent_requests: int | None = None
    """Cap on this tenant's requests in flight at the gate (positive); ``None`` = the server's default."""
    adapters: frozenset[str] = frozenset()
    """Names of the LoRA adapters the tenant may use (``adapters``); empty = base model only."""
    host_quota_tokens: int | None = None
    """Cap on the tenant's (or its group's) tokens in the host tier, all namespaces together (positive);
    ``host_quota_tokens`` in the file, else ``quota_tokens``; ``None`` = no cap but the host's size."""
    l3_quota_tokens: int | None = None
    """Cap on the tenant's (or its group's) tokens in L3 storage (positive); ``None`` = only the overall cap."""
    max_queued_requests: int = 0
    """Requests of the tenant that may wait at the gate for one of its ``max_concurrent_requests`` slots (0: none
    wait, the request gets 429)."""
    requests_per_minute: int | None = None
    """Cap on the tenant's requests per minute (a bucket of this size refilled over a minute); ``None`` = none."""
    tokens_per_minute: int | None = None
    """Cap on the tenant's prompt plus output tokens per minute (reserved on arrival, settled at completion:
    :mod:`sglang_iso.server.rate_limits`); ``None`` = none."""
    cache_ttl_seconds: int | None = None
    """Idle retention of the tenant's cache in seconds (``cache_ttl_seconds``); ``None`` = the file's default."""
    cache_max_age_seconds: int | None = None
    """Absolute lifetime of the tenant's cache in seconds (``cache_max_age_seconds``); ``None`` = the file's
    default."""
    kv_share: float | None = None
    """Largest fraction of the KV pool and of the running batch the tenant's requests in flight may hold, in
    (0, 1] (``kv_share``); ``None`` = the file's ``default_kv_share``. A group holds the largest share of its
    members (one namespace owner)."""


@dataclass(frozen=True)
class PrefixMessage:
    """One chat message of a shared prefix given as ``messages``."""

    role: str
    """Chat role (non-empty), e.g. ``system``."""
    content: str
    """Message text."""


@dataclass(frozen=True)
class SharedPrefix:
    """An operator-provided prefix cached once and readable by the listed tenants. Immutable."""

    name: str
    """Unique name, matches ``SHARED_PREFIX_NAME_PATTERN``."""
    text: str | None
    """Raw prompt text; exactly one of ``text`` and ``messages`` is set."""
    messages: tuple[PrefixMessage, ...] | None
    """Chat messages rendered with the model's template; exactly one of ``text`` and ``messages`` is set."""
    tenants: frozenset[str] | AllTenants
    """Tenant ids allowed to read it (all defined in the file), or ``"*"`` for every tenant."""


@dataclass(frozen=True)
class TenantsConfig:
    """A validated tenants file. Immutable; reload by calling :func:`load_tenants_file` again."""

    secret: bytes
    """Namespace HMAC key (>= 32 bytes). Never log it."""
    admin_key_hashes: frozenset[str]
    """SHA-256 hex digests of admin keys (may be empty: no admin access)."""
    tenants: dict[str, Tenant]
    """Tenant id -> tenant, in file order. Shared by every reader of this config: never mutate it."""
    shared_prefixes: tuple[SharedPrefix, ...]
    """Shared prefixes in file order."""
    source: Path
    """The file this was loaded from."""
    router_key_hashes: frozenset[str] = frozenset()
    """SHA-256 hex digests of the prefill/decode router's keys (``router_key_sha256``; may be empty)."""
    default_cache_ttl_seconds: int | None = None
    """``cache_ttl_seconds`` of tenants that set none; ``None`` = no idle retention limit."""
    default_cache_max_age_seconds: int | None = None
    """``cache_max_age_seconds`` of tenants that set none; ``None`` = no lifetime limit."""
    default_kv_share: float | None = None
    """``kv_share`` of tenants that set none (``default_kv_share``); ``None`` = 0.5, or 1 when the file has one
    owner (one tenant or one group): see :meth:`kv_share_of`."""

    def kv_share_of(self, owner: str) -> float:
        """The KV share of a namespace owner (a tenant id or a group name); the default for an unknown owner."""
        shares, default = self._kv_shares
        return shares.get(owner, default)

    @functools.cached_property
    def _kv_shares(self) -> tuple[dict[str, float], float]:
        """Owner -> share (a group's: the largest of its members'), and the default: the scheduler asks per
        queued request and prefill pass, so it is worked out once (the config is immutable)."""
        default = self.default_kv_share
        if default is None:
            owners = {t.group or t.id for t in self.tenants.values()}
            default = 1.0 if len(owners) <= 1 else DEFAULT_KV_SHARE
        shares: dict[str, float] = {}
        for t in self.tenants.values():
            owner = t.group if t.group is not None else t.id
            share = t.kv_share if t.kv_share is not None else default
            shares[owner] = max(shares.get(owner, share), share)
        return shares, default

    def __repr__(self) -> str:
        # NOTE: redact the secret, because reprs end up in logs and tracebacks.
        return (
            f"TenantsConfig(source={str(self.source)!r}, tenants={list(self.tenants)!r}, "
            f"admin_keys={len(self.admin_key_hashes)}, router_keys={len(self.router_key_hashes)}, "
            f"shared_prefixes={len(self.shared_prefixes)}, secret=<redacted>)"
        )


_TOP_FIELDS = (
    "namespace_secret_file", "namespace_secret_env", "admin_key_sha256", "router_key_sha256", "default_kv_share",
    "default_cache_ttl_seconds", "default_cache_max_age_seconds", "tenants", "shared_prefixes",
)  # fmt: skip
_TENANT_FIELDS = (
    "id", "key_sha256", "quota_tokens", "host_quota_tokens", "l3_quota_tokens", "cache", "max_concurrent_requests",
    "max_queued_requests", "requests_per_minute", "tokens_per_minute", "kv_share", "adapters", "cache_ttl_seconds",
    "cache_max_age_seconds",
)  # fmt: skip
_PREFIX_FIELDS = ("name", "text", "messages", "tenants")
_MESSAGE_FIELDS = ("role", "content")


def load_tenants_file(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> TenantsConfig:
    """Read, parse and validate a tenants file.

    ``environ`` (default ``os.environ``) is where ``namespace_secret_env`` is looked up.
    Reads the tenants file and the secret file; mutates nothing.

    Raises:
        ConfigError: for any problem, naming the file, the field and (best effort) the line.
    """
    source = Path(path)
    try:
        text = source.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(source, None, f"cannot read tenants file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(source, None, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, None, f"TOML syntax error: {exc}", _syntax_error_line(exc, text)) from None
    return _build(Validator(source, LineLocator(text)), data, os.environ if environ is None else environ)


def _build(v: Validator, data: dict[str, object], environ: Mapping[str, str]) -> TenantsConfig:
    v.no_unknown_fields(data, _TOP_FIELDS, "", None)
    owners: dict[str, str] = {}
    admin_hashes = v.key_hashes(data, "admin_key_sha256", "admin_key_sha256", None, owners, required=False)
    router_hashes = v.key_hashes(data, "router_key_sha256", "router_key_sha256", None, owners, required=False)
    tenants: dict[str, Tenant] = {}
    for index, (table, section) in enumerate(v.tables(data, "tenants", "tenants", None, required=True)):
        tenant = _tenant(v, table, f"tenants[{index}]", section, owners)
        if tenant.id in tenants:
            v.fail(f"tenants[{index}].id", f"duplicate tenant id {tenant.id!r}", section, "id")
        tenants[tenant.id] = tenant
    prefixes: list[SharedPrefix] = []
    for index, (table, section) in enumerate(v.tables(data, "shared_prefixes", "shared_prefixes", None)):
        prefix = _shared_prefix(v, table, f"shared_prefixes[{index}]", section, tenants)
        same = next((o.name for o in prefixes if shared_prefix_key(o.name) == shared_prefix_key(prefix.name)), None)
        if same is not None:
            why = "" if same == prefix.name else f" (names differ only in case from {same!r}; case does not count)"
            where = f"shared_prefixes[{index}].name"
            v.fail(where, f"duplicate shared prefix name {prefix.name!r}{why}", section, "name")
        prefixes.append(prefix)
    secret = _secret(v, data, environ)
    return TenantsConfig(
        secret,
        frozenset(admin_hashes),
        tenants,
        tuple(prefixes),
        v.source,
        router_key_hashes=frozenset(router_hashes),
        default_kv_share=v.optional_fraction(data, "default_kv_share", "default_kv_share", None),
        default_cache_ttl_seconds=v.optional_positive_int(
            data, "default_cache_ttl_seconds", "default_cache_ttl_seconds", None
        ),
        default_cache_max_age_seconds=v.optional_positive_int(
            data, "default_cache_max_age_seconds", "default_cache_max_age_seconds", None
        ),
    )


def _tenant(
    v: Validator, table: dict[str, object], field: str, section: tuple[str, int], owners: dict[str, str]
) -> Tenant:
    v.no_unknown_fields(table, _TENANT_FIELDS, field + ".", section)
    tenant_id = v.string(table, "id", f"{field}.id", section)
    if not is_valid_tenant_id(tenant_id):
        v.fail(f"{field}.id", f"invalid tenant id {tenant_id!r}; must match {TENANT_ID_PATTERN.pattern}", section, "id")
    hashes = v.key_hashes(table, "key_sha256", f"{field}.key_sha256", section, owners, required=True)
    quota = v.optional_positive_int(table, "quota_tokens", f"{field}.quota_tokens", section)
    host_quota = v.optional_positive_int(table, "host_quota_tokens", f"{field}.host_quota_tokens", section)
    l3_quota = v.optional_positive_int(table, "l3_quota_tokens", f"{field}.l3_quota_tokens", section)
    concurrency = v.optional_positive_int(table, "max_concurrent_requests", f"{field}.max_concurrent_requests", section)
    kv_share = v.optional_fraction(table, "kv_share", f"{field}.kv_share", section)
    queued = v.optional_positive_int(table, "max_queued_requests", f"{field}.max_queued_requests", section)
    rpm = v.optional_positive_int(table, "requests_per_minute", f"{field}.requests_per_minute", section)
    tpm = v.optional_positive_int(table, "tokens_per_minute", f"{field}.tokens_per_minute", section)
    ttl = v.optional_positive_int(table, "cache_ttl_seconds", f"{field}.cache_ttl_seconds", section)
    max_age = v.optional_positive_int(table, "cache_max_age_seconds", f"{field}.cache_max_age_seconds", section)
    policy_text = v.optional_string(table, "cache", f"{field}.cache", section) or "private"
    policy: CachePolicy
    group: str | None = None
    if policy_text in CACHE_POLICIES:
        policy = "private" if policy_text == "private" else "off"
    elif policy_text.startswith("group:") and GROUP_NAME_PATTERN.fullmatch(policy_text[len("group:") :]):
        policy, group = "private", policy_text[len("group:") :]
    else:
        v.fail(
            f"{field}.cache",
            f'invalid cache policy {policy_text!r}; valid: {_VALID_POLICIES}, "group:<name>" '
            f"(name must match {GROUP_NAME_PATTERN.pattern})",
            section,
            "cache",
        )
    adapters = _adapters(v, table, f"{field}.adapters", section)
    return Tenant(
        tenant_id,
        frozenset(hashes),
        quota,
        policy,
        group,
        concurrency,
        adapters,
        host_quota_tokens=host_quota if host_quota is not None else quota,
        l3_quota_tokens=l3_quota,
        kv_share=kv_share,
        max_queued_requests=queued or 0,
        requests_per_minute=rpm,
        tokens_per_minute=tpm,
        cache_ttl_seconds=ttl,
        cache_max_age_seconds=max_age,
    )


def _adapters(v: Validator, table: dict[str, object], field: str, section: tuple[str, int]) -> frozenset[str]:
    if "adapters" not in table:
        return frozenset()
    names = v.string_list(table, "adapters", field, section)
    for index, name in enumerate(names):
        if not ADAPTER_NAME_PATTERN.fullmatch(name):
            v.fail(
                f"{field}[{index}]",
                f"invalid adapter name {name!r}; must match {ADAPTER_NAME_PATTERN.pattern}",
                section,
                "adapters",
                f'"{name}"',
            )
        if name in names[:index]:
            v.fail(f"{field}[{index}]", f"adapter {name!r} listed twice", section, "adapters", f'"{name}"', 1)
    return frozenset(names)


def _shared_prefix(
    v: Validator, table: dict[str, object], field: str, section: tuple[str, int], tenants: Mapping[str, Tenant]
) -> SharedPrefix:
    v.no_unknown_fields(table, _PREFIX_FIELDS, field + ".", section)
    name = v.string(table, "name", f"{field}.name", section)
    if not is_valid_shared_prefix_name(name):
        v.fail(
            f"{field}.name", f"invalid name {name!r}; must match {SHARED_PREFIX_NAME_PATTERN.pattern}", section, "name"
        )
    if ("text" in table) == ("messages" in table):
        both = "both" if "text" in table else "neither"
        v.fail(f"{field}.text", f"exactly one of text and messages is required, got {both}", section, None)
    text: str | None = None
    messages: tuple[PrefixMessage, ...] | None = None
    if "text" in table:
        text = v.string(table, "text", f"{field}.text", section)
        if not text:
            v.fail(f"{field}.text", "must not be empty", section, "text")
    else:
        items = []
        for index, (entry, _) in enumerate(v.tables(table, "messages", f"{field}.messages", section, required=True)):
            entry_field = f"{field}.messages[{index}]"
            v.no_unknown_fields(entry, _MESSAGE_FIELDS, entry_field + ".", section, anchor="messages")
            role = v.string(entry, "role", f"{entry_field}.role", section, anchor="messages")
            if not role:
                v.fail(f"{entry_field}.role", "must not be empty", section, "messages")
            content = v.string(entry, "content", f"{entry_field}.content", section, anchor="messages")
            items.append(PrefixMessage(role, content))
        messages = tuple(items)
    readers = v.string_list(table, "tenants", f"{field}.tenants", section)
    if not readers:
        v.fail(f"{field}.tenants", 'must list at least one tenant id, or be ["*"]', section, "tenants")
    allowed: frozenset[str] | AllTenants = ALL_TENANTS
    if readers != [ALL_TENANTS]:
        for index, reader in enumerate(readers):
            where = f"{field}.tenants[{index}]"
            if reader == ALL_TENANTS:
                v.fail(where, '"*" must be the only entry when used', section, "tenants", '"*"')
            if reader not in tenants:
                v.fail(where, f"unknown tenant {reader!r}; not defined in [[tenants]]", section, "tenants", reader)
            if reader in readers[:index]:
                v.fail(where, f"tenant {reader!r} listed twice", section, "tenants", reader)
        allowed = frozenset(readers)
    return SharedPrefix(name, text, messages, allowed)


def _secret(v: Validator, data: dict[str, object], environ: Mapping[str, str]) -> bytes:
    has_file, has_env = "namespace_secret_file" in data, "namespace_secret_env" in data
    if has_file == has_env:
        if has_file:
            v.fail(
                "namespace_secret_file",
                "set only one of namespace_secret_file and namespace_secret_env",
                None,
                "namespace_secret_env",
            )
        v.fail("namespace_secret_file", "one of namespace_secret_file and namespace_secret_env is required", None, None)
    field = "namespace_secret_file" if has_file else "namespace_secret_env"
    value = v.string(data, field, field, None)
    if not value:
        v.fail(field, "must not be empty", None, field)
    try:
        if has_file:
            return read_secret_file(v.source.parent / value).value
        return read_secret_env(value, environ).value
    except SecretError as exc:
        v.fail(field, str(exc), None, field)


def _syntax_error_line(exc: Exception, text: str) -> int | None:
    line = getattr(exc, "lineno", None)  # Python 3.14+
    if isinstance(line, int):
        return line
    match = re.search(r"at line (\d+)", str(exc))
    if match:
        return int(match.group(1))
    if "end of document" in str(exc):
        return max(1, len(text.splitlines()))
    return None
