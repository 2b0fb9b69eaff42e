"""Reading and editing an SGLang command line (``--flag value`` or ``--flag=value``)."""

from __future__ import annotations

from collections.abc import Sequence


def has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of the first ``flag`` in ``argv``; None when absent (or last, without a value)."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def without_flag(argv: Sequence[str], flag: str) -> list[str]:
    """``argv`` with every ``flag`` and its value removed."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if not a.startswith(flag + "="):
            out.append(a)
    return out
