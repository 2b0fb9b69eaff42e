"""The cache-sharing audit (Gu et al., ICML 2025) against real servers: upstream leaks, sglang-iso does not.

Two servers, one run each: plain upstream SGLang (no keys, one global cache) must show cross-client sharing by
timing and by ``cached_tokens``; sglang-iso with a tenants file must show none across tenants while the
same-tenant scope (a second key of the victim's tenant) is detected in the same run: the positive control
that fails if caching were simply off. Samples and prompts are smaller than the full audit
(``benchmark/audit.py``) so the module stays within a few minutes on a 2-core CPU.

Each server serves exactly one test, so its fixture is function-scoped: it starts once per module and is gone
before the next one starts. NOTE: an idle SGLang scheduler busy-polls about half a core on CPU; two servers
alive at once would slow the second audit's timings on a 2-core machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_iso.audit import main
from sglang_iso.models import tiny_model_path
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess, baseline_server_argv, free_port

from .conftest import CPU_SIZES, start_iso_server
from .helpers import TENANTS, write_tenants_file

pytestmark = pytest.mark.e2e

SAMPLES = "20"
UPSTREAM_SAMPLES = "30"
"""More for upstream: under machine load some hits come out slow (D fell to 0.55, p = 0.002, at 20 samples once)."""
PROMPT_TOKENS = "800"
ALPHA = 0.01


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in (*TENANTS, "admin", "acme-2")}


@pytest.fixture
def upstream() -> Iterator[ServerProcess]:
    port = free_port()
    server = ServerProcess(baseline_server_argv(port, tiny_model_path(), *CPU_SIZES), port)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def iso(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    # A second key for acme: the same-tenant scope.
    path = write_tenants_file(
        tmp_path_factory.mktemp("audit-tenants"), {**keys, "acme": [keys["acme"], keys["acme-2"]]}
    )
    server = start_iso_server("--tenants-file", str(path), "--enable-cache-report")
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _audit(out: Path, *argv: str, samples: str = SAMPLES) -> dict[str, dict]:
    common = ["--samples", samples, "--prompt-tokens", PROMPT_TOKENS, "--alpha", str(ALPHA), "--out-dir", str(out)]
    assert main([*common, *argv]) == 0
    return {r["scope"]: r for r in json.loads((out / "audit.json").read_text())["results"]}


def test_upstream_shares_across_clients(upstream: ServerProcess, tmp_path: Path) -> None:
    # No keys and no cache_salt/extra_key: upstream's one global cache.
    results = _audit(
        tmp_path,
        "--base-url",
        upstream.base_url,
        "--api",
        "sglang",
        "--scopes",
        "other-tenant",
        samples=UPSTREAM_SAMPLES,
    )
    other = results["other-tenant"]
    assert other["detected"] and other["p_value"] < ALPHA, other
    assert other["median_attacker_s"] < other["median_miss_s"]
    assert other["oracle"]["attacker_cached_median"] > 0.9 * other["oracle"]["prompt_tokens_median"], other
    assert other["oracle"]["detected"], other


def test_iso_isolates_tenants_same_tenant_still_shares(
    iso: ServerProcess, keys: dict[str, str], tmp_path: Path
) -> None:
    argv = (
        *("--base-url", iso.base_url, "--api", "openai", "--scopes", "same-tenant,other-tenant"),
        *("--victim-key", keys["acme"], "--same-tenant-key", keys["acme-2"], "--attacker-key", keys["globex"]),
    )
    results = _audit(tmp_path, *argv)
    same, other = results["same-tenant"], results["other-tenant"]
    # Positive control in the same run: caching is on and shared inside the tenant.
    assert same["detected"] and same["p_value"] < ALPHA, same
    assert same["oracle"]["attacker_cached_median"] > 0, same
    _assert_no_oracle_sharing(other)
    if other["detected"]:
        # A timing verdict at ALPHA is a false positive in about one run in 1/ALPHA by construction, more often on
        # this 2-core host where the client and three server processes share the cores. A real cross-tenant hit
        # is flagged at p < 1e-8 (the same-tenant control above) and again in a second run with fresh prompts.
        print(f"other-tenant flagged by timing alone (p = {other['p_value']:.3g}); confirming with fresh prompts")
        again = _audit(tmp_path / "confirm", *argv)
        assert again["same-tenant"]["detected"], again["same-tenant"]
        other = again["other-tenant"]
        _assert_no_oracle_sharing(other)
    # Isolation: timing indistinguishable from certain misses.
    assert not other["detected"] and other["p_value"] > ALPHA, other
    assert (tmp_path / "audit.png").exists()


def _assert_no_oracle_sharing(other: dict) -> None:
    """The oracle says nothing: at most the one or two tokens that random prompts of the attacker's own namespace
    share by chance (first syllables)."""
    assert not other["oracle"]["detected"], other
    assert other["oracle"]["attacker_cached_max"] < 0.01 * other["oracle"]["prompt_tokens_median"], other
