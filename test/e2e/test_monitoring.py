"""A real Prometheus scrapes a live sglang-iso server as the ServiceMonitor does, with our alerting rules loaded.

One server (hierarchical cache with the file tier, quotas, a rate-limited tenant, metrics on) and one Prometheus
(1 s scrape and rule evaluation, the admin key as bearer token). After traffic from two tenants, every query of the
Grafana dashboard (deploy/base/dashboards/sglang-iso.json) returns data through Prometheus' HTTP API, and the
isolation alert is silent; then a request whose namespace tag is forged on its way to the scheduler (test plugin
:mod:`sglang_iso_testing.forge_tag`) makes SglangIsoIsolationViolation fire for ``tenant="unverified"``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_iso.server.hicache_args import UPSTREAM_DIR_ENV
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing import forge_tag
from sglang_iso_testing.process import ServerProcess, free_port
from sglang_iso_testing.tenants import write_tenants_file

from .conftest import start_iso_server
from .helpers import long_prompt

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "base" / "dashboards" / "sglang-iso.json"
RULES = ROOT / "deploy" / "monitoring" / "alerts.yaml"
PROMETHEUS = shutil.which("prometheus")
JOB = "sglang-iso-worker"
"""The scrape job's name: the alerts' ``up`` matchers expect the ServiceMonitor's Service name."""
RATE_WINDOW = "1m"
"""What ``$__rate_interval`` stands for in the dashboard's queries (Grafana substitutes it)."""
DEADLINE_S = 60.0

if PROMETHEUS is None:
    pytest.skip(
        "prometheus not found: scripts/install.sh installs Debian's prometheus package as root",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in ("acme", "globex", "limited", "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("monitoring")
    (d / "l3").mkdir()
    limited = {"quota_tokens": 8000, "requests_per_minute": 1}
    tenants = {"acme": {"quota_tokens": 8000}, "globex": {"quota_tokens": 8000}, "limited": limited}
    write_tenants_file(d, tenants, keys=keys, name="t.toml")
    srv = start_iso_server(
        "--tenants-file", str(d / "t.toml"), "--enable-hierarchical-cache", "--hicache-storage-backend", "file",
        "--enable-metrics",
        env={UPSTREAM_DIR_ENV: str(d / "l3"), **forge_tag.plugin_env()},
    )  # fmt: skip
    try:
        srv.start(timeout_s=400)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, server: ServerProcess, keys: dict[str, str]) -> Iterator[str]:
    d = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "metrics_path": "/metrics",
                "authorization": {"type": "Bearer", "credentials": keys["admin"]},
                "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}],
            }
        ],
    }
    (d / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    assert PROMETHEUS is not None
    log = (d / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("Prometheus not ready:\n" + (d / "prometheus.log").read_text()[-3000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def api(url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=10) as r:
        out = json.loads(r.read())
    assert out["status"] == "success", out
    return out["data"]


def alerts(url: str, name: str) -> list[dict[str, Any]]:
    return [a for a in api(url, "alerts")["alerts"] if a["labels"].get("alertname") == name]


def generate(server: ServerProcess, key: str, text: str) -> int:
    status, _ = server.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
        headers={"Authorization": f"Bearer {key}"},
        timeout_s=300,
    )
    return status


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"].replace("$__rate_interval", RATE_WINDOW))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_dashboard_queries_return_data_and_a_forged_tag_fires_the_isolation_alert(
    server: ServerProcess, prometheus: str, keys: dict[str, str]
) -> None:
    # Every tenant's counters exist at 0 before its first request (a rate needs the baseline): wait for a scrape.
    baseline: list[Any] = []
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and len(baseline) < 3:
        baseline = api(prometheus, "query", query="sglang_iso:prompt_tokens_total == 0")["result"]
        time.sleep(0.5)
    assert sorted(b["metric"]["tenant"] for b in baseline) == ["acme", "globex", "limited"], baseline
    for tenant in ("acme", "globex"):
        prompt = long_prompt()
        assert [generate(server, keys[tenant], prompt) for _ in range(3)] == [200] * 3
    assert generate(server, keys["limited"], long_prompt()) == 200
    assert generate(server, keys["limited"], long_prompt()) == 429  # a refusal for the gate's panel
    assert generate(server, "sk-iso-not-a-key", "x") == 401

    missing: dict[str, str] = {}
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        missing = {f"{title}: {expr}": expr for title, expr in dashboard_queries()
                   if not api(prometheus, "query", query=expr)["result"]}  # fmt: skip
        if not missing:
            break
        time.sleep(2)
    assert not missing, f"dashboard queries without data: {sorted(missing)}"
    targets = api(prometheus, "targets")["activeTargets"]
    assert [t["health"] for t in targets if t["labels"]["job"] == JOB] == ["up"], targets

    # Negative control: traffic alone does not make the isolation alert pending or firing.
    assert alerts(prometheus, "SglangIsoIsolationViolation") == []

    assert generate(server, keys["globex"], f"{forge_tag.MARKER} {long_prompt()}") == 200  # served, unshared
    time.sleep(1.5)  # the scheduler exports its counters at most once a second, on its next cache operation
    assert generate(server, keys["acme"], long_prompt()) == 200
    firing: list[dict[str, Any]] = []
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not firing:
        firing = [a for a in alerts(prometheus, "SglangIsoIsolationViolation") if a["state"] == "firing"]
        time.sleep(1)
    assert [a["labels"]["tenant"] for a in firing] == ["unverified"], alerts(prometheus, "SglangIsoIsolationViolation")
    assert alerts(prometheus, "SglangIsoWorkerDown") == []  # the scrape with the admin key works
