"""Write deploy/base/prometheusrule.yaml (a Prometheus Operator PrometheusRule) from deploy/monitoring/alerts.yaml.

The rule file is the one source: promtool checks and unit-tests it (test/deploy/test_alerts.py), and that test
fails when the rendered PrometheusRule differs from what this script writes. Run after editing the alerts:

    .venv/bin/python scripts/render_alerts.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "monitoring" / "alerts.yaml"
RENDERED = ROOT / "deploy" / "base" / "prometheusrule.yaml"
HEADER = """\
# Generated from deploy/monitoring/alerts.yaml by scripts/render_alerts.py: edit that file, then rerun the script.
# Prometheus Operator alerting rules for the workers; needs the monitoring.coreos.com CRDs (like the ServiceMonitor).
"""


class _Dumper(yaml.SafeDumper):
    """Long strings (expressions, descriptions) as folded blocks, so every line stays under yamllint's 120."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ">" if len(value) > 80 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def render() -> str:
    """The PrometheusRule document for the rule file's groups."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "sglang-iso-alerts",
            "labels": {"app.kubernetes.io/name": "sglang-iso", "app.kubernetes.io/component": "alerts"},
        },
        "spec": {"groups": groups},
    }
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, default_flow_style=False)
    return HEADER + body


def main() -> None:
    RENDERED.write_text(render())
    print(f"wrote {RENDERED.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
