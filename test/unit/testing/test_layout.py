"""The test harness stays out of the runtime package, and the benchmarks do not reach into test/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_iso import envvars

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "python" / "sglang_iso"
IMPORT_TESTING = re.compile(r"^\s*(from|import)\s+sglang_iso_testing\b", re.MULTILINE)


def test_runtime_package_never_imports_the_harness() -> None:
    # NOTE: the ``sglang-iso demo`` command is the one door from the CLI to the harness (a lazy import).
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted(RUNTIME.rglob("*.py"))
        if IMPORT_TESTING.search(path.read_text()) and path.name != "cli.py"
    ]
    assert offenders == []


def test_benchmarks_do_not_import_test_code() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "benchmark").glob("*.py"))
        if re.search(r"^\s*(from|import)\s+test\b", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []


def test_the_harness_modules_exist_where_the_tests_expect_them() -> None:
    import sglang_iso_testing.process as process
    import sglang_iso_testing.routing as routing

    assert process.ServerProcess.__module__ == "sglang_iso_testing.process"
    assert routing.router_argv.__module__ == "sglang_iso_testing.routing"
    assert not (RUNTIME / "server" / "process.py").exists()
    assert not (RUNTIME / "server" / "routing.py").exists()


def test_test_plugins_need_the_testing_switch() -> None:
    from sglang_iso.plugin import test_plugin_refusal
    from sglang_iso.settings import Settings
    from sglang_iso_testing.plant import plant_env

    def refusal_in(env: dict[str, str]) -> str | None:
        return test_plugin_refusal(Settings.from_env(env))

    assert refusal_in({}) is None
    assert refusal_in(plant_env()) is None
    refusal = refusal_in({envvars.TEST_PLUGINS.name: "sglang_iso_testing.plant"})
    assert refusal is not None and envvars.TEST_PLUGINS.name in refusal and "sglang_iso_testing.plant" in refusal
    assert refusal_in({envvars.TEST_PLUGINS.name: "x", envvars.TESTING.name: "0"}) is not None


def test_launcher_refuses_a_test_plugin_without_the_switch() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != envvars.TESTING.name}
    env[envvars.TEST_PLUGINS.name] = "sglang_iso_testing.plant"
    argv = [sys.executable, "-m", "sglang_iso.cli", "serve", "--model-path", "m", "--iso-dry-run"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2
    assert f"{envvars.TEST_PLUGINS.name}=sglang_iso_testing.plant" in out.stderr
    ok = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, envvars.TESTING.name: "1"})
    assert ok.returncode == 0, ok.stderr  # positive control: the harness's switch lets it through


def test_production_code_has_no_plant() -> None:
    text = "\n".join(p.read_text() for p in RUNTIME.rglob("*.py"))
    for word in ("test_plant", "armed_plants", "planted_read_zero", "TEST_PLANT"):
        assert word not in text, word


def test_every_package_is_shipped_by_pyproject() -> None:
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    present = {
        ".".join(init.parent.relative_to(base).parts)
        for base in (ROOT / "python", ROOT / "sgl-kernel-patches")
        for init in base.rglob("__init__.py")
    }
    assert present - listed == set()  # a package `pip install .` would silently leave out
    assert "sglang_iso_testing" not in listed  # the harness is its own distribution (testing/), not in the wheel
    harness = tomllib.loads((ROOT / "testing" / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert harness["packages"] == ["sglang_iso_testing"] and (ROOT / "testing/sglang_iso_testing/plant.py").is_file()


def test_the_plugin_refuses_test_plugins_without_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_iso import plugin

    monkeypatch.setenv(envvars.TEST_PLUGINS.name, "sglang_iso_testing.plant")
    monkeypatch.delenv(envvars.TESTING.name, raising=False)
    with pytest.raises(RuntimeError, match=envvars.TEST_PLUGINS.name):
        plugin.register()  # NOTE: raises before registering anything, so the tenant backend stays unregistered


def test_launcher_refuses_the_comparison_servers_switch() -> None:
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "sglang_iso.cli", "serve", "--model-path", "m", "--iso-dry-run"]
    env = {k: v for k, v in os.environ.items() if k != envvars.BASELINE.name}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**env, envvars.BASELINE.name: "1"})
    assert out.returncode == 2 and envvars.BASELINE.name in out.stderr, out.stderr
    control = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert control.returncode == 0, control.stderr[-2000:]  # the same launch without it plans a server
