"""The HTTP -> scheduler command protocol: every command survives the trip through its key; SGLang's keys are not
ours; the scheduler side runs ours and passes everything else on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sglang_iso.integration import commands, hooks

EVERY = [
    commands.flush("acme"),
    commands.flush("*"),
    commands.flush_adapter("acme-ft:3f2a"),
    commands.erase("acme", "9f3c2a"),
    commands.CHECK_INTEGRITY,
    commands.PD_STATUS,
    commands.PD_RECLAIM,
]


@pytest.mark.parametrize("command", EVERY, ids=lambda c: c.key)
def test_each_command_round_trips_through_its_key(command: commands.Command) -> None:
    assert commands.parse(command.key) == command


def test_an_erase_names_its_owner_and_receipt() -> None:
    assert commands.erase_parts(commands.erase("hooli-group", "9f3c2a")) == ("hooli-group", "9f3c2a")


@pytest.mark.parametrize(
    "key", ["max_running_requests", "sglang_iso.flush", "sglang_iso.check_integrity:x", "sglang_iso.nope", "", 7]
)
def test_other_keys_are_not_commands(key: object) -> None:
    assert commands.parse(key) is None


class _Tree:
    def __init__(self) -> None:
        self.flushed: list[str] = []

    def flush_owner(self, owner: str) -> int:
        self.flushed.append(owner)
        return 0

    def check_integrity(self) -> bool:
        return True


def _controller(tree: _Tree) -> Any:
    return SimpleNamespace(scheduler=SimpleNamespace(tree_cache=tree))


def test_the_scheduler_runs_ours_and_passes_sglang_keys_on() -> None:
    tree, passed = _Tree(), []

    def original(controller: Any, req: Any) -> str:
        passed.append(req.server_args)
        return "sglang"

    out = hooks.handle_iso_commands(original, _controller(tree), SimpleNamespace(server_args={"globex": 1}))
    assert out == "sglang" and passed == [{"globex": 1}] and tree.flushed == []  # not ours: SGLang's
    out = hooks.handle_iso_commands(original, _controller(tree), SimpleNamespace(server_args={EVERY[0].key: 1}))
    assert out.updated is True and tree.flushed == ["acme"] and len(passed) == 1
    mixed = {EVERY[0].key: 1, "max_running_requests": 1}  # ours and SGLang's in one request: refused whole
    out = hooks.handle_iso_commands(original, _controller(tree), SimpleNamespace(server_args=mixed))
    assert out.updated is False and tree.flushed == ["acme"] and len(passed) == 1
