"""The commands the HTTP process sends every scheduler, both ends in one place.

They ride SGLang's own ``set_internal_state`` call (``SetInternalStateReq.server_args``, one key per command, value
1), which reaches every scheduler rank and returns one ``updated`` flag per rank; the scheduler side
(:func:`sglang_iso.integration.hooks.handle_iso_commands`, AROUND ``set_internal_state``) takes a request made only
of these keys for itself and passes any other request on to SGLang. Keys:

    sglang_iso.flush:<owner>            drop the owner's (tenant's or group's) unlocked entries; "*": every owner
    sglang_iso.flush_adapter:<lora id>  drop the entries computed with one adapter load (after an unload)
    sglang_iso.erase:<owner>@<id>       flush the owner, scrub its freed pages now, keep a receipt under <id>
                                        (read back from the ranks' internal state: ``erase_receipts``)
    sglang_iso.check_integrity          run the tree's invariant check; ``updated`` is its outcome
    sglang_iso.pd_status                nothing (the reply's internal state carries the PD quarantine)
    sglang_iso.pd_reclaim               release the pages of timed-out PD transfers, scrubbed
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, cast

Kind = Literal["flush", "flush_adapter", "erase", "check_integrity", "pd_status", "pd_reclaim"]

_PREFIX = "sglang_iso."
_WITH_ARGUMENT: tuple[Kind, ...] = ("flush", "flush_adapter", "erase")
_PLAIN: tuple[Kind, ...] = ("check_integrity", "pd_status", "pd_reclaim")


class Command(NamedTuple):
    kind: Kind
    argument: str = ""
    """The owner (``flush``; ``"*"`` for all), the adapter load id (``flush_adapter``), ``owner@receipt id``
    (``erase``); empty otherwise."""

    @property
    def key(self) -> str:
        """The ``server_args`` key that carries this command."""
        return f"{_PREFIX}{self.kind}:{self.argument}" if self.kind in _WITH_ARGUMENT else _PREFIX + self.kind


def flush(owner: str) -> Command:
    return Command("flush", owner)


def flush_adapter(lora_id: str) -> Command:
    return Command("flush_adapter", lora_id)


def erase(owner: str, receipt_id: str) -> Command:
    return Command("erase", f"{owner}@{receipt_id}")


def erase_parts(command: Command) -> tuple[str, str]:
    """(owner, receipt id) of an ``erase`` command."""
    owner, _, receipt_id = command.argument.rpartition("@")
    return owner, receipt_id


CHECK_INTEGRITY = Command("check_integrity")
PD_STATUS = Command("pd_status")
PD_RECLAIM = Command("pd_reclaim")


def parse(key: object) -> Command | None:
    """The command a ``server_args`` key carries, or None for any other key (SGLang's own)."""
    if not isinstance(key, str) or not key.startswith(_PREFIX):
        return None
    name, colon, argument = key[len(_PREFIX) :].partition(":")
    if colon and name in _WITH_ARGUMENT:
        return Command(cast(Kind, name), argument)
    if not colon and name in _PLAIN:
        return Command(cast(Kind, name))
    return None


async def send(tokenizer_manager: Any, command: Command) -> list[bool]:
    """Send ``command`` to every scheduler; one ``updated`` flag per rank (empty: no rank answered)."""
    from sglang.srt.managers.io_struct import SetInternalStateReq

    results = await tokenizer_manager.set_internal_state(SetInternalStateReq(server_args={command.key: 1}))
    return [bool(r) for r in results or []]
