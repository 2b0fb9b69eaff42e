"""``python -m sglang_iso.audit``."""

from __future__ import annotations

from .runner import main

raise SystemExit(main())
