"""Shape and type checks for parsed TOML tables, raising :class:`ConfigError` with field path and line.

Each check takes the table, the key inside it, the dotted ``field`` path for the
message (``tenants[1].id``) and the :data:`~sglang_iso.tenancy._locate.Section`
the table came from, so the line can be looked up. ``anchor`` replaces the key
for the line lookup when the table is inline (``messages = [{...}]``) and its
own keys cannot be found by the locator.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

from sglang_iso.tenancy._locate import LineLocator, Section
from sglang_iso.tenancy.errors import ConfigError

KEY_HASH_PATTERN = re.compile(r"[0-9a-f]{64}")
"""A stored key hash: SHA-256 hex digest, lowercase (see :func:`sglang_iso.tenancy.keys.key_sha256`)."""


class Validator:
    """Raises :class:`ConfigError` for one source file. Holds no mutable state."""

    __slots__ = ("_locator", "source")

    def __init__(self, source: Path, locator: LineLocator) -> None:
        self.source = source
        self._locator = locator

    def fail(
        self,
        field: str,
        reason: str,
        section: Section | None,
        key: str | None,
        needle: str | None = None,
        occurrence: int = 0,
    ) -> NoReturn:
        """Raise a ConfigError for ``field``; the line is that of ``key`` (or ``needle`` after it) in ``section``.

        See :meth:`LineLocator.line_of` for ``needle`` and ``occurrence``.
        """
        raise ConfigError(self.source, field, reason, self._locator.line_of(section, key, needle, occurrence))

    def no_unknown_fields(
        self,
        table: dict[str, object],
        allowed: Iterable[str],
        prefix: str,
        section: Section | None,
        anchor: str | None = None,
    ) -> None:
        """Fail on the first key of ``table`` not in ``allowed``, listing the valid ones."""
        valid = tuple(allowed)
        for key in table:
            if key not in valid:
                self.fail(f"{prefix}{key}", f"unknown field; valid fields: {', '.join(valid)}", section, anchor or key)

    def string(
        self, table: dict[str, object], key: str, field: str, section: Section | None, anchor: str | None = None
    ) -> str:
        """The required string ``table[key]``."""
        if key not in table:
            self.fail(field, "missing required field", section, anchor)
        return self._expect_str(table[key], field, section, anchor or key)

    def optional_string(self, table: dict[str, object], key: str, field: str, section: Section | None) -> str | None:
        """``table[key]`` if present (must be a string), else ``None``."""
        return self._expect_str(table[key], field, section, key) if key in table else None

    def optional_positive_int(
        self, table: dict[str, object], key: str, field: str, section: Section | None
    ) -> int | None:
        """``table[key]`` if present (must be an integer > 0; booleans are refused), else ``None``."""
        value = self._optional_number(table, key, field, section, "a positive integer", lambda v: isinstance(v, int))
        return value if isinstance(value, int) and value > 0 else None

    def optional_fraction(
        self, table: dict[str, object], key: str, field: str, section: Section | None
    ) -> float | None:
        """``table[key]`` if present (a number in (0, 1]; booleans are refused), else ``None``."""
        rule = "a number greater than 0 and at most 1"
        value = self._optional_number(table, key, field, section, rule, lambda v: v <= 1)
        return float(value) if value is not None else None

    def _optional_number(
        self,
        table: dict[str, object],
        key: str,
        field: str,
        section: Section | None,
        rule: str,
        ok: Callable[[int | float], bool],
    ) -> int | float | None:
        """``table[key]`` if present: a number > 0 (not a boolean) for which ``ok`` holds; else fail saying ``rule``."""
        if key not in table:
            return None
        value = table[key]
        if not isinstance(value, int | float) or isinstance(value, bool) or not (value > 0 and ok(value)):
            got = repr(value) if isinstance(value, int | float) and not isinstance(value, bool) else _toml_type(value)
            self.fail(field, f"must be {rule}, got {got}", section, key)
        return value

    def string_list(self, table: dict[str, object], key: str, field: str, section: Section | None) -> list[str]:
        """The required array of strings ``table[key]`` (may be empty)."""
        if key not in table:
            self.fail(field, "missing required field", section, None)
        value = table[key]
        if not isinstance(value, list):
            self.fail(field, f"must be an array of strings, got {_toml_type(value)}", section, key)
        for index, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(f"{field}[{index}]", f"must be a string, got {_toml_type(item)}", section, key)
        return list(value)

    def key_hashes(
        self,
        table: dict[str, object],
        key: str,
        field: str,
        section: Section | None,
        owners: dict[str, str],
        *,
        required: bool,
    ) -> list[str]:
        """Array of SHA-256 hex digests at ``table[key]``; records each in ``owners`` (hash -> field path).

        Mutates ``owners``. Fails on a malformed hash, or on a hash already in
        ``owners`` (a key must map to exactly one principal). When ``required``,
        the array must be present and non-empty.
        """
        if key not in table:
            if required:
                self.fail(field, "missing required field (at least one key hash)", section, None)
            return []
        hashes = self.string_list(table, key, field, section)
        if required and not hashes:
            self.fail(field, "must list at least one key hash", section, key)
        for index, digest in enumerate(hashes):
            where = f"{field}[{index}]"
            repeat = hashes[:index].count(digest)
            if not KEY_HASH_PATTERN.fullmatch(digest):
                # NOTE: never echo the value, because an operator may have pasted the raw API key here.
                hint = "; it looks like a raw API key: store only its hash" if digest.startswith("sk-") else ""
                self.fail(
                    where,
                    f"must be 64 lowercase hex characters (SHA-256 of the key, see `sglang-iso keys hash`), "
                    f"got a {len(digest)}-character string{hint}",
                    section,
                    key,
                    digest,
                    repeat,
                )
            if digest in owners:
                self.fail(
                    where,
                    f"duplicate key hash {digest[:12]}...: already used by {owners[digest]}; "
                    "a key must map to exactly one principal",
                    section,
                    key,
                    digest,
                    repeat,
                )
            owners[digest] = where
        return hashes

    def tables(
        self,
        table: dict[str, object],
        key: str,
        field: str,
        section: Section | None,
        *,
        required: bool = False,
    ) -> list[tuple[dict[str, object], Section]]:
        """The array of tables ``table[key]`` with each entry's section (``[[key]]`` blocks at top level).

        When ``required`` the array must be present and non-empty; otherwise absent means empty.
        """
        if key not in table:
            if required:
                self.fail(field, f"missing required field (at least one [[{key}]] entry)", section, None)
            return []
        value = table[key]
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            self.fail(field, f"must be an array of tables ([[{key}]]), got {_toml_type(value)}", section, key)
        if required and not value:
            self.fail(field, "must not be empty", section, key)
        return [(item, (key, index) if section is None else section) for index, item in enumerate(value)]

    def _expect_str(self, value: object, field: str, section: Section | None, key: str) -> str:
        if not isinstance(value, str):
            self.fail(field, f"must be a string, got {_toml_type(value)}", section, key)
        return value


def _toml_type(value: object) -> str:
    """TOML name of a parsed value's type, for messages."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, datetime.date | datetime.time):
        return "date/time"
    return type(value).__name__
