"""Best-effort line numbers for keys in a TOML document, for error messages.

``tomllib`` reports positions only for syntax errors, so after parsing we find a
field again by scanning the raw text: table headers split the file into
sections, and a key is the first ``key =`` line inside its section. This covers
the layout the tenants file is documented with (``[[tenants]]`` blocks of
``key = value`` lines); inline tables and unusual quoting fall back to the
section header or to no line at all. Never raises; a wrong guess only makes an
error message less precise, so nothing here is security relevant.

Section layout (``Section = ("tenants", 1)`` is the second ``[[tenants]]``)::

    line 1  namespace_secret_env = ...   <- top level: before the first header
    line 3  [[tenants]]                  <- ("tenants", 0)
    line 4  id = "acme"
    line 6  [[tenants]]                  <- ("tenants", 1): lines 6..(next header - 1)
    line 7  id = "globex"
"""

from __future__ import annotations

import re
from typing import NamedTuple

Section = tuple[str, int]
"""An array-of-tables entry: (table name, 0-based index among headers of that name)."""

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(?:#.*)?$")


class _Header(NamedTuple):
    line: int
    """1-based line number of the header."""
    name: str
    """Dotted table name with quotes removed (``tenants``, ``a.b``)."""
    is_array: bool
    """True for ``[[name]]``, False for ``[name]``."""


class LineLocator:
    """Maps (section, key, value) to a 1-based line of the raw text. Immutable after construction."""

    __slots__ = ("_headers", "_lines")

    def __init__(self, text: str) -> None:
        self._lines = text.splitlines()
        self._headers = _scan_headers(self._lines)

    def line_of(
        self, section: Section | None, key: str | None = None, needle: str | None = None, occurrence: int = 0
    ) -> int | None:
        """Line of ``key`` in ``section`` (``None`` = top level), or of ``needle`` at/after that key.

        With no ``key`` the section's header line is returned (useful for a missing
        field). ``needle`` (a value as written, e.g. one element of a multi-line
        array) refines the key's line to the line at or after it holding the
        needle's ``occurrence``-th appearance (0-based, for repeated values); if
        the needle is not found the key's line is kept. Returns ``None`` when
        nothing matches.
        """
        span = self._span(section)
        if span is None:
            return None
        header_line, start, end = span
        if key is None:
            return header_line
        key_line = self._find_key(key, start, end)
        if key_line is None:
            return self._find_header(key) if section is None else None
        if needle:
            seen = 0
            for index in range(key_line - 1, end):
                seen += self._lines[index].count(needle)
                if seen > occurrence:
                    return index + 1
        return key_line

    def _span(self, section: Section | None) -> tuple[int | None, int, int] | None:
        """(header line, first body line, last body line), 1-based, inclusive."""
        if section is None:
            first_header = self._headers[0].line if self._headers else len(self._lines) + 1
            return None, 1, first_header - 1
        name, index = section
        matches = [pos for pos, header in enumerate(self._headers) if header.is_array and header.name == name]
        if index >= len(matches):
            return None
        pos = matches[index]
        header = self._headers[pos]
        end = self._headers[pos + 1].line - 1 if pos + 1 < len(self._headers) else len(self._lines)
        return header.line, header.line + 1, end

    def _find_key(self, key: str, start: int, end: int) -> int | None:
        quoted = re.escape(key)
        pattern = re.compile(rf"""^\s*(?:{quoted}|"{quoted}"|'{quoted}')\s*[.=]""")
        for index in range(start - 1, end):
            if pattern.match(self._lines[index]):
                return index + 1
        return None

    def _find_header(self, key: str) -> int | None:
        for header in self._headers:
            if header.name == key or header.name.startswith(key + "."):
                return header.line
        return None


def _scan_headers(lines: list[str]) -> list[_Header]:
    """Table headers outside multi-line strings, in file order."""
    headers: list[_Header] = []
    open_delimiter: str | None = None
    for number, line in enumerate(lines, start=1):
        if open_delimiter is None:
            match = _HEADER.match(line)
            if match:
                name = ".".join(part.strip().strip("\"'") for part in match.group(2).split("."))
                headers.append(_Header(number, name, match.group(1) == "[["))
                continue
        for delimiter in ('"""', "'''"):
            if open_delimiter in (None, delimiter) and line.count(delimiter) % 2 == 1:
                open_delimiter = delimiter if open_delimiter is None else None
                break
    return headers
