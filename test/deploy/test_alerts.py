"""The alerting rules on a real promtool: syntax, a unit case per alert (fires on its condition, silent without it),
every alert documented in the runbook, and the kustomize base's PrometheusRule rendered from the same file."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yaml"
UNIT_TESTS = MONITORING / "alerts_test.yaml"
RUNBOOK = ROOT / "deploy" / "README.md"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: scripts/install.sh installs Debian's prometheus package as root"
)


def alerts() -> list[dict[str, object]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def render_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_alerts", ROOT / "scripts" / "render_alerts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0 and f"SUCCESS: {len(alerts())} rules found" in out.stdout, out.stdout + out.stderr


@needs_promtool
def test_promtool_unit_cases_pass() -> None:
    out = promtool("test", "rules", str(UNIT_TESTS))
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


@needs_promtool
def test_a_broken_threshold_fails_the_unit_cases(tmp_path: Path) -> None:
    """Negative control: the unit cases catch an alert that no longer fires on its condition."""
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    broken = RULES.read_text().replace("isolation_violations_total[5m])) > 0", "isolation_violations_total[5m])) > 9")
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    out = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert out.returncode != 0 and "SglangIsoIsolationViolation" in out.stdout + out.stderr, out.stdout


def test_every_alert_has_a_unit_case_a_severity_and_a_runbook_entry() -> None:
    cases = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    tested = {case["alertname"] for test in cases for case in test.get("alert_rule_test", [])}
    fired = {case["alertname"] for test in cases for case in test.get("alert_rule_test", []) if case["exp_alerts"]}
    runbook = RUNBOOK.read_text()
    for rule in alerts():
        name = str(rule["alert"])
        assert name in tested and name in fired, f"{name}: no unit case that makes it fire"
        labels = rule.get("labels")
        assert isinstance(labels, dict) and labels.get("severity") in ("critical", "warning", "info"), rule
        annotations = rule.get("annotations")
        assert isinstance(annotations, dict) and annotations.get("runbook") == f"deploy/README.md#{name.lower()}"
        assert re.search(rf"^#+ `?{name}`?$", runbook, re.MULTILINE), f"{name}: no runbook heading in deploy/README.md"


def test_the_prometheusrule_is_rendered_from_the_rule_file() -> None:
    module = render_script()
    assert module.RENDERED.read_text() == module.render(), "run: .venv/bin/python scripts/render_alerts.py"
    rendered = yaml.safe_load(module.RENDERED.read_text())
    assert rendered["kind"] == "PrometheusRule"
    assert rendered["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
