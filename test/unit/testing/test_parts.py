"""benchmark/parts.py pairs each variant with upstream round by round, and reads a ratio per server start."""

from __future__ import annotations

import http.server
import math
import statistics
import threading
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from sglang_iso import envvars
from test.unit.testing.conftest import load_benchmark


def load() -> ModuleType:
    return load_benchmark("parts")


def test_a_round_is_compared_with_upstreams_same_round() -> None:
    parts = load()
    times = {"upstream": [10.0, 20.0, 40.0], "iso": [11.0, 21.0, 44.0]}
    row = parts.summarize(times)["iso"]
    paired = [i / u for u, i in zip(times["upstream"], times["iso"], strict=True)]
    assert row["ratio"] == pytest.approx(statistics.median(paired))
    assert (row["ratio_min"], row["ratio_max"]) == pytest.approx((min(paired), max(paired)))
    assert parts.summarize(times)["upstream"]["ratio"] == 1.0  # (upstream against itself: the control)


def test_each_start_is_one_sample_of_the_interval() -> None:
    parts = load()
    starts = [
        {"upstream": [10.0, 10.0, 10.0], "iso": [10.5, 10.4, 10.6], "both-off": [10.1, 10.0, 10.2]},
        {"upstream": [12.0, 12.0, 12.0], "iso": [12.9, 12.6, 12.8], "both-off": [12.1, 12.2, 12.0]},
        {"upstream": [9.0, 9.0, 9.0], "iso": [9.3, 9.5, 9.4], "both-off": [9.0, 9.1, 9.1]},
    ]
    got = parts.over_starts(starts)
    assert set(got) == {"iso", "both-off"}
    medians = [parts.summarize(s)["iso"]["ratio"] for s in starts]
    mean, low, high = got["iso"]
    assert mean == pytest.approx(math.exp(statistics.fmean(math.log(m) for m in medians)))
    assert low < mean < high
    assert got["both-off"][0] < mean  # the variant with the parts off reads nearer upstream


def test_one_start_gives_no_interval() -> None:
    parts = load()
    with pytest.raises(ValueError):
        parts.over_starts([{"upstream": [10.0], "iso": [11.0]}])


def test_the_time_after_the_first_event_is_the_request_less_its_first_event() -> None:
    parts = load()
    run = parts.Rounds(times={"upstream": [100.0, 90.0], "iso": [104.0, 95.0]},
                       ttfts={"upstream": [40.0, 38.0], "iso": [40.0, 37.0]})  # fmt: skip
    assert run.after_first() == {"upstream": [60.0, 52.0], "iso": [64.0, 58.0]}


def test_the_time_after_the_first_event_is_read_only_one_request_at_a_time() -> None:
    """Above concurrency 1 a block's time per request is its wall time over its requests (5 ms at 8 clients) while
    a request's first event still takes its whole latency (40 ms): their difference is no request's time, so it is
    not read over the starts (it had ended a run without its summary)."""
    parts = load()
    runs = [parts.Rounds(times={"upstream": [5.0, 5.2], "iso": [5.1, 5.3]},
                         ttfts={"upstream": [40.0, 41.0], "iso": [41.0, 42.0]}) for _ in range(3)]  # fmt: skip
    assert set(parts.start_measures(runs, stream=True, concurrency=8)) == {"request", "to the first event"}
    assert set(parts.start_measures(runs, stream=False, concurrency=1)) == {"request", "to the first event"}
    alone = [parts.Rounds(times={"upstream": [100.0, 90.0], "iso": [104.0, 95.0]},
                          ttfts={"upstream": [40.0, 38.0], "iso": [40.0, 37.0]}) for _ in range(3)]  # fmt: skip
    one = parts.start_measures(alone, stream=True, concurrency=1)  # control: one at a time it is read
    assert set(one) == {"request", "to the first event", "after the first event"}
    assert one["after the first event"][0] == {"upstream": [60.0, 52.0], "iso": [64.0, 58.0]}
    want = statistics.median([64.0 / 60.0, 58.0 / 52.0])  # (each start the same: its median paired ratio)
    assert parts.over_starts(one["after the first event"])["iso"][0] == pytest.approx(want)


def test_a_round_upstream_spent_no_measurable_time_in_is_left_out() -> None:
    """A block's CPU time can be under the clock's tick (0): that round has no ratio; the others keep theirs."""
    parts = load()
    row = parts.summarize({"upstream": [0.0, 10.0], "iso": [10.0, 12.0]})["iso"]
    assert row["ratio"] == pytest.approx(12.0 / 10.0)
    assert math.isnan(parts.summarize({"upstream": [0.0], "iso": [10.0]})["iso"]["ratio"])


def test_the_profiler_and_the_phase_timer_load_together(tmp_path: Path) -> None:
    parts = load()
    both = parts.plugin_env(True, tmp_path)
    plugins = both[envvars.TEST_PLUGINS.name].split(",")
    assert plugins == ["sglang_iso_testing.phase_timer", "sglang_iso_testing.cpu_profile"], plugins
    assert both[envvars.CPU_PROFILE_DIR.name] == str(tmp_path) and both[envvars.TESTING.name] == "1"
    assert parts.plugin_env(False, tmp_path)[envvars.TEST_PLUGINS.name] == "sglang_iso_testing.cpu_profile"
    assert parts.plugin_env(False, None) is None


def test_an_open_connection_the_server_closed_is_opened_again() -> None:
    parts = load()
    served: list[int] = []

    class Once(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, but the socket is closed after each answer without saying so

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            payload = b'data: {"text": "a"}\n\ndata: [DONE]\n\n'
            served.append(1)
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.close_connection = True

        def log_message(self, *_args: object) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Once)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        server = SimpleNamespace(port=httpd.server_address[1])
        for _ in range(3):  # the 2nd and 3rd find the first connection closed
            assert parts._request_on_open_connection(server, b"{}", {"Content-Length": "2"}) >= 0.0
        assert len(served) == 3
    finally:
        httpd.shutdown()
