"""DP routing follows the tenants config in force: a reload that moves a tenant into a group moves its rank."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_iso import envvars
from sglang_iso.integration import dp_routing
from sglang_iso.integration.front import state
from sglang_iso.server.dp import tenant_rank
from sglang_iso.server.gate import STATE_TENANT
from sglang_iso.tenancy.config import TenantsConfig, load_tenants_file
from sglang_iso_testing.tenants import write_tenants_file

DP = 4


def _config(folder: Path, group: str | None) -> TenantsConfig:
    folder.mkdir(exist_ok=True)
    fields = {"cache": f"group:{group}"} if group is not None else {}
    return load_tenants_file(str(write_tenants_file(folder, {"acme": fields}, name="t.toml").path))


def _routed(tenant: str | None) -> int | None:
    manager = SimpleNamespace(server_args=SimpleNamespace(dp_size=DP))
    obj = SimpleNamespace(routed_dp_rank=3)  # a client value: always overwritten
    request = SimpleNamespace(state=SimpleNamespace(**({STATE_TENANT: tenant} if tenant else {})))
    dp_routing.route_to_tenant_rank(manager, obj, request)
    return obj.routed_dp_rank


def test_rank_follows_a_reload_into_a_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    group = next(g for g in (f"g{i}" for i in range(100)) if tenant_rank(g, DP) != tenant_rank("acme", DP))
    monkeypatch.setenv(envvars.TENANTS_FILE.name, str(tmp_path / "a" / "t.toml"))
    monkeypatch.setattr(state, "_CURRENT", SimpleNamespace(config=_config(tmp_path / "a", None)))
    assert _routed("acme") == tenant_rank("acme", DP)
    assert _routed(None) is None  # no authenticated tenant: the load balancer decides, nothing shared
    state._CURRENT.config = _config(tmp_path / "b", group)  # what a SIGHUP reload does (FrontState.replace_config)
    assert _routed("acme") == tenant_rank(group, DP)
    assert _routed("unknown") == tenant_rank("unknown", DP)
