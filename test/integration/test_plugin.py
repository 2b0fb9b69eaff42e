"""The plugin registers the tenant backend and the hooks that guard it."""

from __future__ import annotations

from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache
from sglang.srt.mem_cache.registry import get_radix_cache_factory
from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_iso import envvars, plugin, settings
from sglang_iso.coverage import NotCoveredError
from sglang_iso.integration import backend, hook_table, hooks

REQUIRED_HOOK_TARGETS = hook_table.targets(required=hook_table.Required.SCHEDULER)


def test_entry_point_is_installed() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("sglang_iso") == "sglang_iso.plugin:register"


def test_register_is_idempotent_and_registers_everything() -> None:
    plugin.register()
    once = {target: len(HookRegistry._hooks[target]) for target in REQUIRED_HOOK_TARGETS}
    plugin.register()
    assert get_radix_cache_factory("tenant") is backend.build_tenant_cache
    for target in REQUIRED_HOOK_TARGETS:
        assert HookRegistry._hooks[target], target
        assert len(HookRegistry._hooks[target]) == once[target], f"hooks registered twice: {target}"
    # Scheduler.__init__ carries two (refuse uncovered speculative BEFORE, verify the tree cache AFTER)
    assert max(once.values()) <= 2


def test_tenant_cache_implements_the_whole_cache_contract() -> None:
    assert issubclass(backend.TenantRadixCache, BasePrefixCache)
    assert not backend.TenantRadixCache.__abstractmethods__
    assert backend.TenantRadixCache.sglang_iso_backend == "tenant"


def test_factory_refuses_when_hooks_were_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HookRegistry, "_patched", set())
    with pytest.raises(RuntimeError, match="required hooks were not applied"):
        backend.build_tenant_cache(None)  # type: ignore[arg-type]


def test_scheduler_check_refuses_a_foreign_tree_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = SimpleNamespace(tree_cache=object())
    monkeypatch.setenv(envvars.REQUIRE_TENANT_CACHE.name, "1")
    with pytest.raises(hooks.UnhardenedCacheError, match="object"):
        hooks.verify_scheduler_tree_cache(None, scheduler)
    # Not enforced for a plain upstream server started from the same environment.
    monkeypatch.delenv(envvars.REQUIRE_TENANT_CACHE.name)
    settings.reset()
    hooks.verify_scheduler_tree_cache(None, scheduler)


@pytest.mark.parametrize("algorithm", ["STANDALONE", "EAGLE", "EAGLE3", "NEXTN"])
def test_factory_refuses_a_draft_model_with_the_host_tier(algorithm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HookRegistry, "_patched", {*HookRegistry._patched, *REQUIRED_HOOK_TARGETS})
    ctx = SimpleNamespace(
        server_args=SimpleNamespace(speculative_algorithm=algorithm), params=SimpleNamespace(is_eagle=True),
        is_hybrid_swa=False, is_hybrid_ssm=False, is_dsa=False, enable_hierarchical_cache=True,
    )  # fmt: skip
    with pytest.raises(NotCoveredError, match=f"{algorithm} with --enable-hierarchical-cache"):
        backend.build_tenant_cache(ctx)  # type: ignore[arg-type]
    ngram = SimpleNamespace(**{**vars(ctx), "server_args": SimpleNamespace(speculative_algorithm="NGRAM")})
    with pytest.raises(Exception) as err:  # positive control: NGRAM passes the refusals (then needs real pools)
        backend.build_tenant_cache(ngram)  # type: ignore[arg-type]
    assert "does not support" not in str(err.value)


_REGISTERED = (
    "import json; from sglang_iso import plugin; from sglang_iso.integration import hook_table;"
    "from sglang.srt.mem_cache.registry import get_radix_cache_factory;"
    "from sglang.srt.plugins.hook_registry import HookRegistry; plugin.register();"
    "print(json.dumps([get_radix_cache_factory('tenant') is not None,"
    " sum(bool(HookRegistry._hooks.get(t)) for t in hook_table.targets())]))"
)


@pytest.mark.parametrize(
    ("env", "registers"),
    [
        ({}, True),  # positive control: an sglang-iso process
        ({envvars.BASELINE.name: "1"}, False),  # the comparison server: plain upstream
        ({envvars.BASELINE.name: "1", envvars.REQUIRE_TENANT_CACHE.name: "1"}, True),  # enforcement wins
    ],
)
def test_the_comparison_server_registers_no_hook(env: dict[str, str], registers: bool) -> None:
    import json
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if k not in (envvars.BASELINE.name, envvars.REQUIRE_TENANT_CACHE.name)}
    out = subprocess.run(
        [sys.executable, "-c", _REGISTERED], env={**clean, **env}, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    backend_registered, hooked = json.loads(out.stdout.strip().splitlines()[-1])
    assert backend_registered is registers
    assert (hooked == len(hook_table.targets())) if registers else (hooked == 0), hooked


_TEST_PLUGINS_REGISTERED = (
    "import json; from sglang_iso import plugin; from sglang_iso_testing import phase_timer, plant;"
    "from sglang.srt.plugins.hook_registry import HookRegistry; plugin.register();"
    "hooks = [hook for entries in HookRegistry._hooks.values() for _, hook, _ in entries];"
    "print(json.dumps([phase_timer.wrap_phases in hooks, plant.plant_before_forward in hooks]))"
)


@pytest.mark.parametrize(("baseline", "plant_loaded"), [(False, True), (True, False)])
def test_the_comparison_server_loads_only_the_test_plugins_that_measure(baseline: bool, plant_loaded: bool) -> None:
    """The phase timer (``MEASURES_BASELINE``) times both servers alike; the plant acts on sglang-iso's tables and
    stays out of the comparison server (positive control: sglang-iso loads both)."""
    import json
    import os
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_ISO_")}
    env = {
        **clean,
        envvars.TESTING.name: "1",
        envvars.TEST_PLUGINS.name: "sglang_iso_testing.phase_timer,sglang_iso_testing.plant",
        **({envvars.BASELINE.name: "1"} if baseline else {}),
    }
    out = subprocess.run([sys.executable, "-c", _TEST_PLUGINS_REGISTERED], env=env, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    timer_loaded, plant_seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert timer_loaded is True
    assert plant_seen is plant_loaded


def test_the_frozen_object_count_is_walked_until_the_freeze_fills_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gc.get_freeze_count()`` walks every frozen object (about 80 ms in a started scheduler, with no forward
    running meanwhile): a status read counts them once the freeze has happened, not on every read."""
    import gc

    counts = iter([0, 0, 750_000, 900_000])
    calls: list[int] = []

    def counted() -> int:
        calls.append(1)
        return next(counts)

    monkeypatch.setattr(hooks._FrozenCount, "seen", 0)
    monkeypatch.setattr(gc, "get_freeze_count", counted)
    assert [hooks.frozen_objects() for _ in range(2)] == [0, 0]  # positive control: read while not frozen
    assert [hooks.frozen_objects() for _ in range(3)] == [750_000] * 3
    assert len(calls) == 3
