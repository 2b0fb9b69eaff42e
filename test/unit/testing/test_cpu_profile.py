"""The CPU-profile test plugin: a profile started and stopped by its signal handler's toggle, and what it counts as
sglang-iso's own time (its frames and the built-ins they call, not other Python code)."""

from __future__ import annotations

import cProfile
import time
from pathlib import Path

from sglang_iso.integration.request_guard import input_ids_problem
from sglang_iso_testing import cpu_profile


def not_ours() -> int:
    return sum(i * i for i in range(200_000))


def _profile(tmp_path: Path) -> Path:
    ids = list(range(2048)) * 50
    profile = cProfile.Profile(time.thread_time_ns, 1e-9)
    profile.enable()
    for _ in range(20):
        input_ids_problem(ids, 2048)
    not_ours()
    profile.disable()
    path = tmp_path / "run.prof"
    profile.dump_stats(str(path))
    return path


def test_own_time_is_our_frames_and_the_builtins_they_call(tmp_path: Path) -> None:
    path = _profile(tmp_path)
    own = cpu_profile.own_ms(path)
    names = [name for name, _ in own.top]
    assert 0 < own.own_ms < own.total_ms, own
    assert any(name.startswith("sglang_iso/integration/request_guard.py") for name in names), names
    assert not any("not_ours" in name or "test_cpu_profile" in name for name in names), names
    assert list(own.parts) == ["request guard"] and own.parts["request guard"] == own.own_ms, own.parts
    # positive control: counting this file as ours takes in its Python work too
    wider = cpu_profile.own_ms(path, (*cpu_profile.OWN_PARTS, "/test_cpu_profile"))
    assert wider.own_ms > own.own_ms and any("not_ours" in name for name, _ in wider.top), wider.top


def test_the_toggle_starts_then_writes_a_profile(tmp_path: Path) -> None:
    assert cpu_profile.toggle(tmp_path) is None  # started
    not_ours()
    path = cpu_profile.toggle(tmp_path)
    assert path is not None and path.exists() and not list(tmp_path.glob("*.partial")), list(tmp_path.iterdir())
    read = cpu_profile.own_ms(path, ("/test_cpu_profile",))
    assert read.own_ms > 0 and any("not_ours" in name for name, _ in read.top), read.top
    assert cpu_profile.toggle(tmp_path) is None  # the next signal starts a new one
    assert cpu_profile.toggle(tmp_path) == path
