"""The whole audit (CLI included) against in-process fake servers: shared cache vs per-tenant caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_iso.audit import AuditConfig, main, run_audit
from sglang_iso.audit.runner import plan_scopes

from .fake_server import FakeCacheServer, serve

KEYS = {"k-acme": "acme", "k-acme-2": "acme", "k-globex": "globex"}


def _argv(url: str, out: Path, *extra: str) -> list[str]:
    return ["--base-url", url, "--samples", "12", "--prompt-tokens", "40", "--out-dir", str(out), "-q", *extra]


@pytest.mark.parametrize("api", ["sglang", "openai"])
def test_shared_cache_is_detected_across_keys(api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve(FakeCacheServer(shared=True, tenants={})) as url:
        assert main(_argv(url, tmp_path, "--api", api, "--fail-on-cross-tenant")) == 3
    report = json.loads((tmp_path / "audit.json").read_text())
    results = {r["scope"]: r for r in report["results"]}
    assert set(results) == {"same-key", "other-tenant"}
    assert results["other-tenant"]["detected"] and results["other-tenant"]["p_value"] < 0.01
    assert results["other-tenant"]["oracle"]["detected"]
    assert len(report["samples"]["other-tenant"]["miss"]) == 12
    assert "| other-tenant | 12 | 12 |" in capsys.readouterr().out
    assert (tmp_path / "audit.md").exists() and (tmp_path / "audit.png").stat().st_size > 0


def test_isolated_tenants_not_detected_but_same_tenant_is(tmp_path: Path) -> None:
    fake = FakeCacheServer(shared=False, tenants=KEYS)
    with serve(fake) as url:
        config = AuditConfig(
            base_url=url,
            victim_key="k-acme",
            attacker_key="k-globex",
            same_tenant_key="k-acme-2",
            api="openai",
            samples=12,
            prompt_tokens=40,
            salt="fixed",
            alpha=0.001,  # NOTE: the other-tenant p-value is uniform here (same latency law): 0.1% false alarms
        )
        report = run_audit(config)
    assert [r.scope for r in report.results] == ["same-key", "same-tenant", "other-tenant"]
    assert report.result("same-key").detected and report.result("same-tenant").detected
    other = report.result("other-tenant")
    assert not other.detected
    assert other.oracle is not None and other.oracle.attacker_cached_max == 0 and not other.oracle.detected
    # probe + 2 warm-ups + per sample and scope: 2 victim sends, 1 hit candidate, 1 miss
    assert fake.requests == 3 + 12 * 3 * 4


def test_request_failure_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve(FakeCacheServer(shared=False, tenants=KEYS)) as url:
        assert main(_argv(url, tmp_path, "--victim-key", "wrong", "--attacker-key", "k-globex")) == 1
    assert "HTTP 401" in capsys.readouterr().err


def test_scope_planning() -> None:
    assert [s.name for s in plan_scopes(AuditConfig())] == ["same-key", "other-tenant"]
    assert [s.name for s in plan_scopes(AuditConfig(victim_key="a"))] == ["same-key"]
    scopes = plan_scopes(AuditConfig(victim_key="a", attacker_key="b", scopes=("other-tenant",)))
    assert [(s.name, s.victim_key, s.attacker_key) for s in scopes] == [("other-tenant", "a", "b")]
    with pytest.raises(ValueError, match="same-tenant-key"):
        plan_scopes(AuditConfig(victim_key="a", scopes=("same-tenant",)))
    with pytest.raises(ValueError, match="choose from"):
        plan_scopes(AuditConfig(scopes=("everyone",)))
    with pytest.raises(ValueError, match="equals"):
        plan_scopes(AuditConfig(victim_key="a", attacker_key="a"))


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--samples", "1"], ["--alpha", "2"], ["--scopes", "same-tenant", "--victim-key", "a"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    capsys.readouterr()
