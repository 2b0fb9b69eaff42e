"""``python -m sglang_iso.audit``."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
