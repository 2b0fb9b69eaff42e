"""Progress lines: count, percentage, rate, ETA (bounded by a deadline), printed at most every ``every_s``."""

from __future__ import annotations

import io

from sglang_iso_testing.progress import Progress


def test_line_has_count_rate_and_eta() -> None:
    p = Progress("fuzz", 100, unit="ops", stream=io.StringIO())
    p.done = 25
    line = p.line(p.t0 + 50.0)
    assert line.startswith("fuzz: 25/100 ops (25.0%), 0.50 ops/s, elapsed 50s, ETA 2m30s"), line


def test_eta_is_capped_by_the_deadline() -> None:
    p = Progress("fuzz", 1000, max_seconds=60.0, stream=io.StringIO())
    p.done = 1
    assert p.line(p.t0 + 10.0).endswith("ETA 50s")


def test_no_rate_yet_gives_unknown_eta() -> None:
    p = Progress("fuzz", 10, stream=io.StringIO())
    assert p.line(p.t0 + 1.0).endswith("ETA ?")


def test_prints_at_most_every_interval_and_at_finish() -> None:
    out = io.StringIO()
    p = Progress("x", 3, every_s=3600.0, stream=out)
    for _ in range(3):
        p.step()
    assert out.getvalue() == ""  # positive control below: finish always prints
    p.finish("done")
    assert out.getvalue().startswith("x: 3/3 requests (100.0%)") and out.getvalue().rstrip().endswith("done")
    eager = io.StringIO()
    q = Progress("y", 2, every_s=0.0, stream=eager)
    q.step()
    q.step()
    assert len(eager.getvalue().splitlines()) == 2
