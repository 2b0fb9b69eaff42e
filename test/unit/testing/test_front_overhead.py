"""benchmark/front_overhead.py runs end to end on a few requests, and refuses to time a request the gate refused."""

from __future__ import annotations

import asyncio
from types import ModuleType

import pytest

from test.unit.testing.conftest import load_benchmark


def load() -> ModuleType:
    return load_benchmark("front_overhead")


def test_it_times_the_gate_and_the_hooks_on_requests_they_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_iso.integration.front import state

    bench = load()
    # NOTE: the benchmark sets the tenants file and the front state for itself; both are restored after the test.
    monkeypatch.setenv("SGLANG_ISO_TENANTS_FILE", "")
    monkeypatch.setattr(state, "_CURRENT", None)
    results = bench.main(["--requests", "5", "--repeats", "1"])
    assert set(results) == {"gate, text prompt", "gate, 512 token ids", "tokenizer-manager hooks"}
    assert all(bare > 0 and iso > 0 for bare, iso in results.values())


def test_a_refused_request_is_not_timed() -> None:
    """The check before timing fails on a gate that refuses (here: a key it does not know); the same body with the
    stand-in app behind no gate passes it (positive control)."""
    bench = load()
    body = next(iter(bench.bodies(0).values()))

    async def refusing(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    with pytest.raises(RuntimeError, match="answered 401"):
        asyncio.run(bench.served_by_gate(refusing, "k", body, 17))
    asyncio.run(bench.served_by_gate(bench.stand_in_app(17), "k", body, 17))
