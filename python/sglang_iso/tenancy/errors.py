"""Errors of the tenancy layer."""

from __future__ import annotations

from pathlib import Path


class ConfigError(ValueError):
    """A tenants file is invalid. The message reads ``FILE[:LINE]: FIELD: reason``."""

    def __init__(self, source: Path, field: str | None, reason: str, line: int | None = None) -> None:
        self.source = source
        """The tenants file."""
        self.field = field
        """Dotted path of the offending field (``tenants[1].id``); ``None`` for file-level and syntax errors."""
        self.line = line
        """1-based line number, when it could be found (best effort)."""
        self.reason = reason
        """What is wrong, without location."""
        where = f"{source}:{line}" if line is not None else str(source)
        super().__init__(f"{where}: {field}: {reason}" if field else f"{where}: {reason}")
