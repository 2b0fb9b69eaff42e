"""Process settings: every variable validated once, a bad value names itself, and nothing else reads them."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_iso import envvars, settings
from sglang_iso.server import gate
from sglang_iso.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "python" / "sglang_iso"
SETTINGS_VARS = (
    envvars.TENANTS_FILE, envvars.METRICS_AUTH, envvars.REQUIRE_TENANT_CACHE, envvars.KV_SCRUB,
    envvars.KV_OWNER_CHECK, envvars.AUDIT_LOG, envvars.L3_DIR, envvars.L3_MAX_BYTES, envvars.PD_DRAIN_TIMEOUT_S,
    envvars.BODY_TIMEOUT_S, envvars.MAX_BODY_READS, envvars.NGRAM_CORPUS, envvars.NGRAM_NS_CAPACITY,
    envvars.NGRAM_MAX_NAMESPACES, envvars.TESTING,
    envvars.TEST_PLUGINS, envvars.BASELINE,
)  # fmt: skip


def test_defaults_are_the_hardened_ones() -> None:
    s = Settings.from_env({})
    assert s.kv_scrub and s.kv_owner_check and s.metrics_need_admin and not s.ngram_corpus_shared
    assert s.tenants_file is None and s.audit_log is None and s.l3_dir is None and s.l3_max_bytes is None
    assert s.pd_drain_timeout_s == float(envvars.PD_DRAIN_TIMEOUT_S.default or "nan")
    assert s.ngram_ns_capacity == int(envvars.NGRAM_NS_CAPACITY.default or 0) > 0
    assert (s.body_timeout_s, s.max_body_reads) == (gate.BODY_TIMEOUT_S, gate.MAX_BODY_READS)  # the gate's own
    assert not s.require_tenant_cache and not s.testing and s.test_plugins == () and not s.baseline
    assert s.scrub_mode == "on-free" and s.tenants() is None


def test_values_are_read() -> None:
    s = Settings.from_env(
        {
            envvars.KV_SCRUB.name: "off",
            envvars.KV_OWNER_CHECK.name: "off",
            envvars.METRICS_AUTH.name: "open",
            envvars.NGRAM_CORPUS.name: "shared",
            envvars.L3_MAX_BYTES.name: " 4096 ",
            envvars.PD_DRAIN_TIMEOUT_S.name: "2.5",
            envvars.BODY_TIMEOUT_S.name: "7.5",
            envvars.MAX_BODY_READS.name: "8",
            envvars.REQUIRE_TENANT_CACHE.name: "1",
            envvars.TEST_PLUGINS.name: " a.b , ,c ",
            envvars.TENANTS_FILE.name: "/etc/t.toml",
        }
    )
    assert not s.kv_scrub and not s.kv_owner_check and not s.metrics_need_admin and s.ngram_corpus_shared
    assert (s.l3_max_bytes, s.pd_drain_timeout_s, s.require_tenant_cache) == (4096, 2.5, True)
    assert s.test_plugins == ("a.b", "c") and s.tenants_file == "/etc/t.toml" and s.scrub_mode == "off"
    assert (s.body_timeout_s, s.max_body_reads) == (7.5, 8)


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        (envvars.KV_SCRUB, "on_free"),
        (envvars.KV_OWNER_CHECK, "yes"),
        (envvars.METRICS_AUTH, "public"),
        (envvars.NGRAM_CORPUS, "tenant"),
        (envvars.L3_MAX_BYTES, "1GB"),
        (envvars.L3_MAX_BYTES, "0"),
        (envvars.PD_DRAIN_TIMEOUT_S, "-1"),
        (envvars.PD_DRAIN_TIMEOUT_S, "nan"),
        (envvars.PD_DRAIN_TIMEOUT_S, "inf"),
        (envvars.BODY_TIMEOUT_S, "0"),
        (envvars.MAX_BODY_READS, "-3"),
        (envvars.NGRAM_NS_CAPACITY, "lots"),
        (envvars.NGRAM_MAX_NAMESPACES, "0"),
        (envvars.REQUIRE_TENANT_CACHE, "yes"),
        (envvars.TESTING, "true"),
        (envvars.BASELINE, "yes"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(variable: envvars.EnvVar, raw: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(variable.name)) as caught:
        Settings.from_env({variable.name: raw})
    assert caught.value.variable == variable.name and repr(raw) in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the launcher prints every ValueError as a startup error


def test_settings_are_frozen_and_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envvars.KV_SCRUB.name, "off")
    first = settings.current()
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.kv_scrub = True  # type: ignore[misc]
    monkeypatch.setenv(envvars.KV_SCRUB.name, "on-free")
    assert settings.current() is first and not first.kv_scrub  # kept for the process
    settings.reset()
    assert settings.current().kv_scrub  # positive control: a reset reads the environment again


def test_only_the_settings_module_reads_the_runtime_variables() -> None:
    # The launcher may set them (it builds the environment its processes inherit); nothing else reads them.
    names = "|".join(_attr(v) for v in SETTINGS_VARS)
    reads = re.compile(rf"envvars\.({names})\.get\(|(environ|env)\.get\(\s*envvars\.({names})\.name\b")
    readers = sorted(
        str(p.relative_to(ROOT))
        for p in RUNTIME.rglob("*.py")
        if p.name != "settings.py" and reads.search(p.read_text())
    )
    assert readers == []
    assert reads.search((RUNTIME / "settings.py").read_text())  # positive control: the pattern finds the reads


def _attr(var: envvars.EnvVar) -> str:
    return next(k for k, v in vars(envvars).items() if v is var)


def test_launcher_refuses_a_bad_value_before_starting_anything() -> None:
    argv = [sys.executable, "-m", "sglang_iso.cli", "serve", "--model-path", "m", "--iso-dry-run"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_ISO_")}
    bad = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**env, envvars.PD_DRAIN_TIMEOUT_S.name: "soon"}
    )
    assert bad.returncode == 2 and f"{envvars.PD_DRAIN_TIMEOUT_S.name}='soon'" in bad.stderr, bad.stderr
    ok = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0, ok.stderr  # positive control: the same launch without the bad value is planned
