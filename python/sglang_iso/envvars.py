"""Every ``SGLANG_ISO_*`` environment variable sglang-iso reads or sets: name, meaning, default.

The one place these names are spelled; modules read them through :meth:`EnvVar.get` so the default
lives here too. ``test/unit/test_envvars.py`` greps the packages for ``SGLANG_ISO_`` and fails on any
name not declared below. Imports nothing from sglang-iso (the interpreter-start hook reads it).

Who sets them: ``operator`` (you, before starting the launcher), ``launcher`` (``sglang-iso serve`` from
its flags, inherited by every SGLang process it spawns), ``harness`` (the test harness only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """One environment variable."""

    name: str
    """``SGLANG_ISO_...``."""
    meaning: str
    """What it controls, and its accepted values."""
    default: str | None
    """Value used when unset (None: unset means off / absent)."""
    set_by: str
    """``operator``, ``launcher`` or ``harness``."""

    def get(self, env: Mapping[str, str] | None = None) -> str | None:
        """The value in ``env`` (default: ``os.environ``), or :attr:`default`."""
        return (os.environ if env is None else env).get(self.name, self.default)


TENANTS_FILE = EnvVar(
    "SGLANG_ISO_TENANTS_FILE", "path of the tenants file (from --tenants-file); turns the tenant gate on", None,
    "launcher",
)  # fmt: skip
METRICS_AUTH = EnvVar(
    "SGLANG_ISO_METRICS_AUTH", "who may read /metrics with a tenants file: 'admin' or 'open'", "admin", "launcher"
)
REQUIRE_TENANT_CACHE = EnvVar(
    "SGLANG_ISO_REQUIRE_TENANT_CACHE",
    "'1': the scheduler refuses to serve unless its tree cache is the tenant cache",
    None,
    "launcher",
)
KV_SCRUB = EnvVar(
    "SGLANG_ISO_KV_SCRUB", "zero KV pages when freed: 'on-free' or 'off' (--kv-scrub)", "on-free", "launcher"
)
KV_OWNER_CHECK = EnvVar(
    "SGLANG_ISO_KV_OWNER_CHECK", "page-ownership check before every forward: 'on' or 'off'", "on", "launcher"
)
AUDIT_LOG = EnvVar("SGLANG_ISO_AUDIT_LOG", "JSON-lines audit log path (--iso-audit-log)", None, "launcher")
L3_DIR = EnvVar(
    "SGLANG_ISO_L3_DIR", "directory of the per-namespace L3 file store (from the HiCache flags)", None, "launcher"
)
L3_MAX_BYTES = EnvVar(
    "SGLANG_ISO_L3_MAX_BYTES", "overall cap of the L3 file store in bytes (from --iso-l3-max-gb)", None, "launcher"
)
PD_DRAIN_TIMEOUT_S = EnvVar(
    "SGLANG_ISO_PD_DRAIN_TIMEOUT_S",
    "seconds a failed PD transfer may take to drain before its pages stay quarantined until reclaimed",
    "60",
    "operator",
)
BODY_TIMEOUT_S = EnvVar(
    "SGLANG_ISO_BODY_TIMEOUT_S", "seconds a request body may take to arrive after its headers (then 408)", "30",
    "operator",
)  # fmt: skip
MAX_BODY_READS = EnvVar(
    "SGLANG_ISO_MAX_BODY_READS", "request bodies one key may have arriving at once (then 429)", "64", "operator"
)
ROUTER_KEY = EnvVar(
    "SGLANG_ISO_ROUTER_KEY", "`sglang-iso router --pd-disaggregation`: the router's own key (default variable)", None,
    "operator",
)  # fmt: skip
ADMIN_KEY = EnvVar(
    "SGLANG_ISO_ADMIN_KEY", "`sglang-iso evidence --base-url`: the admin key it reads counters with (default variable)",
    None, "operator",
)  # fmt: skip
NGRAM_CORPUS = EnvVar(
    "SGLANG_ISO_NGRAM_CORPUS", "NGRAM draft corpus: 'namespace' (one per namespace) or 'shared'", "namespace",
    "operator",
)  # fmt: skip
NGRAM_NS_CAPACITY = EnvVar(
    "SGLANG_ISO_NGRAM_NS_CAPACITY", "trie nodes per namespace NGRAM corpus (each preallocated)", "100000", "operator"
)
NGRAM_MAX_NAMESPACES = EnvVar(
    "SGLANG_ISO_NGRAM_MAX_NAMESPACES", "NGRAM corpora kept before the least recently used is dropped", "32", "operator"
)
FORCE_CPU = EnvVar("SGLANG_ISO_FORCE_CPU", "'1': apply the CPU shims even where CUDA is available", None, "operator")
NO_CPU_HOOK = EnvVar(
    "SGLANG_ISO_NO_CPU_HOOK", "'1': the interpreter-start hook does not apply the CPU shims", None, "operator"
)
SECRET = EnvVar(
    "SGLANG_ISO_SECRET",
    "conventional variable for the namespace secret, read only when the tenants file says "
    'namespace_secret_env = "SGLANG_ISO_SECRET" (the deploy manifests do)',
    None,
    "operator",
)
AUDIT_VICTIM_KEY = EnvVar("SGLANG_ISO_AUDIT_VICTIM_KEY", "`sglang-iso audit`: the victim's API key", None, "operator")
AUDIT_ATTACKER_KEY = EnvVar(
    "SGLANG_ISO_AUDIT_ATTACKER_KEY", "`sglang-iso audit`: another tenant's API key", None, "operator"
)
AUDIT_SAME_TENANT_KEY = EnvVar(
    "SGLANG_ISO_AUDIT_SAME_TENANT_KEY", "`sglang-iso audit`: a second key of the victim's tenant", None, "operator"
)
TEST_PLUGINS = EnvVar(
    "SGLANG_ISO_TEST_PLUGINS",
    "comma-separated test-only plugin modules loaded in every SGLang process; refused without SGLANG_ISO_TESTING=1",
    None,
    "harness",
)
TESTING = EnvVar("SGLANG_ISO_TESTING", "'1': this server is started by the test harness", None, "harness")
START_LOG = EnvVar(
    "SGLANG_ISO_START_LOG", "file the test harness appends a JSON line to for every server it starts (seconds taken)",
    None, "harness",
)  # fmt: skip
CPU_PROFILE_DIR = EnvVar(
    "SGLANG_ISO_CPU_PROFILE_DIR",
    "directory for the profiles of the test plugin sglang_iso_testing.cpu_profile (benchmark/parts.py --cpu-profile)",
    None,
    "harness",
)
FORWARD_GAP_US = EnvVar(
    "SGLANG_ISO_FORWARD_GAP_US",
    "microseconds the test plugin sglang_iso_testing.forward_gap holds the scheduler before every second forward "
    "(benchmark/forward_gap.py)",
    "0",
    "harness",
)
FORWARD_GAP_KB = EnvVar(
    "SGLANG_ISO_FORWARD_GAP_KB",
    "kilobytes the test plugin sglang_iso_testing.forward_gap writes over during each of its holds (0: none)",
    "0",
    "harness",
)
BASELINE = EnvVar(
    "SGLANG_ISO_BASELINE",
    "'1': `python -m sglang_iso.baseline_server`, plain upstream for comparison: the plugin applies the CPU shims "
    "only (no sglang-iso hook, no tenant cache); sglang-iso's launcher refuses it, SGLANG_ISO_REQUIRE_TENANT_CACHE=1 "
    "overrides it",
    None,
    "launcher",
)

ALL: tuple[EnvVar, ...] = (
    TENANTS_FILE,
    METRICS_AUTH,
    REQUIRE_TENANT_CACHE,
    KV_SCRUB,
    KV_OWNER_CHECK,
    AUDIT_LOG,
    L3_DIR,
    L3_MAX_BYTES,
    PD_DRAIN_TIMEOUT_S,
    BODY_TIMEOUT_S,
    MAX_BODY_READS,
    ROUTER_KEY,
    NGRAM_CORPUS,
    NGRAM_NS_CAPACITY,
    NGRAM_MAX_NAMESPACES,
    FORCE_CPU,
    NO_CPU_HOOK,
    SECRET,
    AUDIT_VICTIM_KEY,
    AUDIT_ATTACKER_KEY,
    AUDIT_SAME_TENANT_KEY,
    TEST_PLUGINS,
    TESTING,
    START_LOG,
    CPU_PROFILE_DIR,
    FORWARD_GAP_US,
    FORWARD_GAP_KB,
    BASELINE,
)
"""Every declared variable, in the order above."""

BY_NAME: dict[str, EnvVar] = {v.name: v for v in ALL}
