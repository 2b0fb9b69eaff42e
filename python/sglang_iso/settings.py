"""The settings of one sglang-iso process: read from the environment once, validated, frozen.

The launcher turns its flags into ``SGLANG_ISO_*`` variables (:mod:`sglang_iso.envvars`) that every SGLang
process it spawns inherits; each process reads them here once, at its first use (the plugin's ``register``
and the launcher both build them at start, so a malformed value stops the server before it serves), and
hands the :class:`Settings` object to what it builds. Nothing else in the runtime reads these variables.

Pure: imports no torch and no SGLang. Not settings, and read where they are used: credentials of the
command-line tools (``sglang-iso router``, ``audit``, ``evidence``) and the two switches of interpreter start-up
(``FORCE_CPU``, ``NO_CPU_HOOK``: read before the launcher has set anything).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from sglang_iso import envvars
from sglang_iso.tenancy.config import TenantsConfig, load_tenants_file

__all__ = ["Settings", "SettingsError", "current", "reset"]

SCRUB_MODES = ("on-free", "off")
OWNER_CHECK_MODES = ("on", "off")
METRICS_AUTH_MODES = ("admin", "open")
NGRAM_CORPUS_MODES = ("namespace", "shared")
_SWITCH = ("1", "0", "")  # "" and unset: off


class SettingsError(ValueError):
    """A ``SGLANG_ISO_*`` variable holds a value sglang-iso does not accept; the message names it and the
    accepted values. Raised at process start: a typo never degrades into a weaker server."""

    def __init__(self, variable: envvars.EnvVar, raw: str, expected: str) -> None:
        super().__init__(f"sglang-iso: {variable.name}={raw!r}: expected {expected}")
        self.variable = variable.name


@dataclass(frozen=True)
class Settings:
    """Everything the runtime reads from the environment, validated. Immutable: built once per process."""

    tenants_file: str | None
    """Path of the tenants file (``--tenants-file``); None: no tenant gate, no tenant identities."""
    metrics_need_admin: bool
    """``/metrics`` needs the admin key (``SGLANG_ISO_METRICS_AUTH=admin``, the default) or is open."""
    require_tenant_cache: bool
    """The scheduler refuses to serve unless its tree cache is the tenant cache (set by the launcher)."""
    kv_scrub: bool
    """Zero KV pages when they are freed (``--kv-scrub on-free``, the default)."""
    kv_owner_check: bool
    """Check page ownership before every forward (the default)."""
    audit_log: str | None
    """JSON-lines audit log path (``--iso-audit-log``); None: off."""
    l3_dir: str | None
    """Directory of the per-namespace L3 file store (from the HiCache flags); None: no L3 tier."""
    l3_max_bytes: int | None
    """Cap of the L3 store in bytes (positive; from ``--iso-l3-max-gb``); None: the store's default."""
    pd_drain_timeout_s: float
    """Seconds a failed PD transfer may take to drain before its pages stay quarantined (positive)."""
    body_timeout_s: float
    """Seconds a request body may take to arrive after its headers before the gate answers 408 (positive)."""
    max_body_reads: int
    """Request bodies one key may have arriving at once before the gate answers 429 (positive)."""
    ngram_corpus_shared: bool
    """One NGRAM draft corpus for all tenants (``shared``) instead of one per namespace (the default)."""
    ngram_ns_capacity: int
    """Trie nodes per namespace NGRAM corpus (positive)."""
    ngram_max_namespaces: int
    """NGRAM corpora kept before the least recently used is dropped (positive)."""
    testing: bool
    """The test harness started this server (``SGLANG_ISO_TESTING=1``)."""
    test_plugins: tuple[str, ...]
    """Test-only plugin modules loaded in every SGLang process (refused without :attr:`testing`)."""
    baseline: bool
    """This is the comparison server (plain upstream): the plugin registers no hook (``SGLANG_ISO_BASELINE=1``)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read and validate every setting from ``env`` (default: ``os.environ``).

        Raises:
            SettingsError: a variable holds a value outside its accepted values (named).
        """
        env = os.environ if env is None else env
        return cls(
            tenants_file=_path(envvars.TENANTS_FILE, env),
            metrics_need_admin=_choice(envvars.METRICS_AUTH, METRICS_AUTH_MODES, env) == "admin",
            require_tenant_cache=_switch(envvars.REQUIRE_TENANT_CACHE, env),
            kv_scrub=_choice(envvars.KV_SCRUB, SCRUB_MODES, env) == "on-free",
            kv_owner_check=_choice(envvars.KV_OWNER_CHECK, OWNER_CHECK_MODES, env) == "on",
            audit_log=_path(envvars.AUDIT_LOG, env),
            l3_dir=_path(envvars.L3_DIR, env),
            l3_max_bytes=_positive_int(envvars.L3_MAX_BYTES, env, "a positive number of bytes", optional=True),
            pd_drain_timeout_s=_positive_float(envvars.PD_DRAIN_TIMEOUT_S, env),
            body_timeout_s=_positive_float(envvars.BODY_TIMEOUT_S, env),
            max_body_reads=_required_int(envvars.MAX_BODY_READS, env),
            ngram_corpus_shared=_choice(envvars.NGRAM_CORPUS, NGRAM_CORPUS_MODES, env) == "shared",
            ngram_ns_capacity=_required_int(envvars.NGRAM_NS_CAPACITY, env),
            ngram_max_namespaces=_required_int(envvars.NGRAM_MAX_NAMESPACES, env),
            testing=_switch(envvars.TESTING, env),
            test_plugins=tuple(
                name for name in (n.strip() for n in (envvars.TEST_PLUGINS.get(env) or "").split(",")) if name
            ),
            baseline=_switch(envvars.BASELINE, env),
        )

    @property
    def scrub_mode(self) -> str:
        """``on-free`` or ``off``, as the launcher's flag spells it."""
        return SCRUB_MODES[0] if self.kv_scrub else SCRUB_MODES[1]

    def tenants(self) -> TenantsConfig | None:
        """The tenants file, loaded now (a reload reads it again); None without one.

        Raises:
            tenancy.errors.ConfigError: the file is malformed (the message names the field).
        """
        return load_tenants_file(self.tenants_file) if self.tenants_file else None


_current: Settings | None = None  # this process's settings, once read (mutated by current() and reset() only)


def current() -> Settings:
    """This process's settings, read from the environment at the first call and kept.

    Raises:
        SettingsError: see :meth:`Settings.from_env` (raised again at every call until the process exits).
    """
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current


def reset() -> None:
    """Forget the settings read, so the next :func:`current` reads the environment again: the launcher after it
    has set its variables (its process serves HTTP), and tests that change the environment."""
    global _current
    _current = None


# ---------------------------------------------------------------------------------------------------------
# private helpers


def _raw(variable: envvars.EnvVar, env: Mapping[str, str]) -> str:
    return (variable.get(env) or "").strip()


def _path(variable: envvars.EnvVar, env: Mapping[str, str]) -> str | None:
    return _raw(variable, env) or None


def _choice(variable: envvars.EnvVar, choices: tuple[str, ...], env: Mapping[str, str]) -> str:
    raw = variable.get(env)
    value = (raw or "").strip()
    if value not in choices:
        raise SettingsError(variable, raw or "", "one of " + ", ".join(repr(c) for c in choices))
    return value


def _switch(variable: envvars.EnvVar, env: Mapping[str, str]) -> bool:
    raw = variable.get(env) or ""
    if raw.strip() not in _SWITCH:
        raise SettingsError(variable, raw, "'1' (on) or '0' / unset (off)")
    return raw.strip() == "1"


def _positive_int(variable: envvars.EnvVar, env: Mapping[str, str], expected: str, *, optional: bool) -> int | None:
    raw = _raw(variable, env)
    if not raw and optional:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SettingsError(variable, raw, expected)
    return value


def _required_int(variable: envvars.EnvVar, env: Mapping[str, str]) -> int:
    value = _positive_int(variable, env, "a positive integer", optional=False)
    if value is None:  # NOTE: unreachable with optional=False; keeps the type exact
        raise SettingsError(variable, "", "a positive integer")
    return value


def _positive_float(variable: envvars.EnvVar, env: Mapping[str, str]) -> float:
    raw = _raw(variable, env)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise SettingsError(variable, raw, "a positive number of seconds")
    return value
