"""Data parallel end to end: ``--dp-size 2`` with a tenants file on CPU.

Two tenants chosen to land on different ranks. Each tenant's requests go to its
stable rank, so its repeated prompt hits the cache (round-robin dispatch would
send the repeat to the other rank and miss: this is the positive control that
proves the routing), the other tenant's identical prompt misses, and
``/iso/tenants`` shows each tenant's tokens on its own rank's row only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from sglang_iso.server.dp import tenant_rank
from sglang_iso.tenancy.keys import new_api_key
from sglang_iso_testing.process import ServerProcess
from sglang_iso_testing.tenants import write_tenants_file

from .conftest import start_iso_server

pytestmark = pytest.mark.e2e

DP = 2
# The first candidates whose stable ranks are 0 and 1 (computed, not hard-coded, so a hash change cannot hide).
_CANDIDATES = [f"tenant-{i}" for i in range(32)]
TENANT_BY_RANK = {r: next(t for t in _CANDIDATES if tenant_rank(t, DP) == r) for r in range(DP)}


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    return {name: new_api_key() for name in (*TENANT_BY_RANK.values(), "admin")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]) -> Iterator[ServerProcess]:
    d = tmp_path_factory.mktemp("dp")
    write_tenants_file(d, list(TENANT_BY_RANK.values()), keys=keys, name="t.toml")
    srv = start_iso_server("--tenants-file", str(d / "t.toml"), "--dp-size", str(DP))
    try:
        srv.start(timeout_s=420)
        yield srv
    finally:
        srv.stop()


def _cached(server: ServerProcess, key: str, text: str) -> int:
    status, out = server.post(
        "/generate",
        {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
        headers={"Authorization": f"Bearer {key}"},
        timeout_s=300,
    )
    assert status == 200, out
    return int(out["meta_info"]["cached_tokens"])


def test_tenants_stay_on_their_rank_reuse_there_and_never_cross(server: ServerProcess, keys: dict[str, str]) -> None:
    a, b = TENANT_BY_RANK[0], TENANT_BY_RANK[1]
    prompt = f"Q {uuid.uuid4().hex}: " + " ".join(f"line {i} of the quarterly report" for i in range(16))
    assert _cached(server, keys[a], prompt) == 0
    for _ in range(2):  # consecutive repeats: round robin would alternate ranks and miss on one of them
        assert _cached(server, keys[a], prompt) > 20  # positive control: same tenant, same rank, reuse
    assert _cached(server, keys[b], prompt) == 0  # isolation: the other tenant (other rank) misses
    assert _cached(server, keys[b], prompt) > 20  # b's own entry on its own rank

    admin = {"Authorization": f"Bearer {keys['admin']}"}
    status, info = server.get_with("/get_server_info", admin)
    assert status == 200
    assert sorted(s["sglang_iso"]["dp_rank"] for s in info["internal_states"]) == list(range(DP))
    status, out = server.get_with("/iso/tenants", admin)
    assert status == 200, out
    for rank, tenant in TENANT_BY_RANK.items():
        rows = out["tenants"][tenant]["ranks"]
        assert len(rows) == DP, rows  # one row per rank
        assert rows[rank]["resident_tokens"] > 0 and rows[rank]["lookup_hit_tokens"] > 0
        other = rows[1 - rank]
        assert other["resident_tokens"] == 0 and other["lookup_hit_tokens"] == 0, rows


def test_client_cannot_choose_the_rank(server: ServerProcess, keys: dict[str, str]) -> None:
    status, out = server.post(
        "/generate",
        {"text": "hello", "routed_dp_rank": 1, "sampling_params": {"max_new_tokens": 1}},
        headers={"Authorization": f"Bearer {keys[TENANT_BY_RANK[0]]}"},
    )
    assert status == 400 and out["error"]["param"] == "routed_dp_rank"
