"""Periodic progress lines for long runs: done / total, rate, elapsed and ETA.

    progress = Progress("leak fuzz", total=100_000, unit="ops", max_seconds=36_000)
    for ...:
        ...
        progress.step()          # prints at most every ``every_s`` seconds (and at the end)
    progress.finish()

With ``max_seconds`` the ETA is the sooner of "all done at the current rate" and the deadline.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Counts units of work and prints ``label: done/total unit (pct), rate unit/s, elapsed, ETA`` lines."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        unit: str = "requests",
        every_s: float = 30.0,
        max_seconds: float | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self.label = label
        self.total = max(0, total)
        self.unit = unit
        self.every_s = every_s
        self.max_seconds = max_seconds
        self.stream = stream
        self.done = 0
        self.t0 = time.monotonic()
        self._last_print = self.t0

    def step(self, n: int = 1, *, note: str = "") -> None:
        """Add ``n`` finished units; print a line if ``every_s`` passed since the last one."""
        self.done += n
        now = time.monotonic()
        if now - self._last_print >= self.every_s:
            self._print(now, note)

    def finish(self, note: str = "") -> None:
        """Print the final line."""
        self._print(time.monotonic(), note)

    def line(self, now: float | None = None) -> str:
        """The progress line as of ``now`` (monotonic seconds)."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self.t0, 1e-9)
        rate = self.done / elapsed
        pct = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        remaining = (self.total - self.done) / rate if rate > 0 else float("inf")
        if self.max_seconds is not None:
            remaining = min(remaining, max(0.0, self.max_seconds - elapsed))
        eta = _duration(remaining) if remaining != float("inf") else "?"
        return (
            f"{self.label}: {self.done}/{self.total} {self.unit}{pct}, {rate:.2f} {self.unit}/s, "
            f"elapsed {_duration(elapsed)}, ETA {eta}"
        )

    def _print(self, now: float, note: str) -> None:
        self._last_print = now
        text = self.line(now) + (f"  {note}" if note else "")
        print(text, file=self.stream or sys.stdout, flush=True)


def _duration(seconds: float) -> str:
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")
