"""``benchmark/bench_serving.py``'s reading of paired runs: one ratio per server start."""

from __future__ import annotations

import http.server
import json
import math
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

from test.unit.testing.conftest import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_serving", "bench_serving_under_test")


def test_each_round_of_repeats_gives_one_ratio(bench: ModuleType) -> None:
    # two rounds of three pairs: the first start ran slower for sglang-iso, the second faster
    assert bench.per_start([0.90, 0.95, 0.92, 1.04, 1.01, 1.10], 3) == [0.92, 1.04]
    assert bench.per_start([0.97, 1.02], 1) == [0.97, 1.02]


def test_pairs_that_are_not_whole_rounds_are_refused(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="whole rounds"):
        bench.per_start([1.0, 1.0, 1.0], 2)
    with pytest.raises(ValueError, match="whole rounds"):
        bench.per_start([1.0], 0)


def test_interval_is_students_t_on_the_logs(bench: ModuleType) -> None:
    from scipy import stats

    ratios = [0.93, 1.02, 0.97, 1.08, 0.95, 0.99]
    mean, lo, hi = bench.interval(ratios)
    logs = [math.log(x) for x in ratios]
    want = stats.t.interval(0.95, len(logs) - 1, loc=sum(logs) / len(logs), scale=stats.sem(logs))
    assert math.isclose(math.log(lo), want[0]) and math.isclose(math.log(hi), want[1])
    assert lo < mean < hi
    assert math.isclose(mean, math.prod(ratios) ** (1 / len(ratios)))
    # a higher confidence widens it; equal ratios leave no width
    lo99, hi99 = bench.interval(ratios, 0.99)[1:]
    assert lo99 < lo and hi < hi99
    assert bench.interval([1.01, 1.01, 1.01]) == pytest.approx((1.01, 1.01, 1.01))


def test_interval_refuses_what_it_cannot_estimate(bench: ModuleType) -> None:
    for bad in ([1.0], [], [1.0, 0.0], [1.0, float("nan")], [1.0, float("inf")]):
        with pytest.raises(ValueError, match="two or more positive"):
            bench.interval(bad)
    assert bench.interval_text([1.0]) == "-"


def test_overall_rows_take_one_sample_per_round(bench: ModuleType) -> None:
    levels = bench.parse_levels("gsp:8,random:8")
    results = {s: {lv: bench.Samples() for lv in levels} for s in bench.SERVERS}
    # two rounds of two repeats; round 1 slower for sglang-iso at both levels, round 2 faster
    for lv, iso in zip(levels, ([9, 9.5, 11, 11], [8, 8, 12, 12]), strict=True):
        results["upstream"][lv].throughput = [10.0] * 4
        results["iso"][lv].throughput = [float(x) for x in iso]
        results["upstream"][lv].p99s = [1.0] * 4
        results["iso"][lv].p99s = [1.0] * 4
    rows = bench.overall_rows(results, levels, repeats=2)
    throughput = rows[0].split("|")
    per_round = [float(x) for x in throughput[6].split(",")]
    assert per_round == pytest.approx([math.sqrt(0.925 * 0.8), math.sqrt(1.1 * 1.2)], abs=0.005)
    assert "over 2 rounds" in throughput[2]
    assert rows[1].split("|")[5].strip().startswith("1.000 (1.000-1.000)")


def _run_file(path: Path, levels: dict[str, list[float]], repeats: int | None = None) -> Path:
    """A ``--json`` file whose upstream runs all read 10 req/s, 1 s P99 and 2 ms of CPU per request, sglang-iso's
    ``levels[name]`` times that, run by run."""
    out: dict[str, dict[str, dict[str, object]]] = {"upstream": {}, "iso": {}}
    for name, factors in levels.items():
        for server, scale in (("upstream", [1.0] * len(factors)), ("iso", factors)):
            row: dict[str, object] = {
                "throughput": [10.0 * f for f in scale],
                "p99s": [1.0 * f for f in scale],
                "cpu_ms": [{"http": 2.0 * f, "scheduler": 2.0 / f} for f in scale],
            }
            if repeats is not None:
                row["repeats"] = repeats
            out[server][name] = row
    path.write_text(json.dumps(out))
    return path


def test_pool_appends_the_starts_of_every_file(bench: ModuleType, tmp_path: Path) -> None:
    a = _run_file(tmp_path / "a.json", {"gsp c=1": [0.96, 0.98], "gsp c=8": [1.0, 0.9], "only here": [1.0, 1.0]})
    b = _run_file(tmp_path / "b.json", {"gsp c=1": [0.94, 0.95, 0.97, 0.99], "gsp c=8": [1.1, 0.9]}, repeats=2)
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in bench.pooled_table([a, b]).splitlines()
            if line.startswith("| ") and not line.startswith("| level")}  # fmt: skip
    assert "only here" not in rows  # (not in every file)
    # file b ran two pairs per start: its starts are the medians of 0.94, 0.95 and of 0.97, 0.99
    gsp1 = [0.96, 0.98, 0.945, 0.98]
    assert rows["gsp c=1"][0].strip() == "4"
    assert rows["gsp c=1"][1].strip() == bench.interval_text(gsp1)
    assert rows["gsp c=1"][2].strip() == bench.interval_text(gsp1)  # (P99 scaled alike)
    assert rows["gsp c=1"][3].strip() == bench.interval_text(gsp1)  # HTTP CPU per request
    assert rows["gsp c=1"][4].strip() == bench.interval_text([1 / x for x in gsp1])  # the scheduler's
    gsp8 = [1.0, 0.9, 1.0]  # (b's one start: the median of 1.1 and 0.9)
    assert rows["gsp c=8"][0].strip() == "3" and rows["gsp c=8"][1].strip() == bench.interval_text(gsp8)
    # the levels' starts do not line up (4 and 3), so no all-levels row is made of them
    assert not any(name.startswith("all levels") for name in rows)
    c = _run_file(tmp_path / "c.json", {"gsp c=1": [0.9, 1.1], "gsp c=8": [0.8, 1.0]})
    pooled = bench.pooled_table([c, a])
    overall = [line for line in pooled.splitlines() if line.startswith("| all levels, req/s")]
    per_start = [math.sqrt(0.9 * 0.8), math.sqrt(1.1 * 1.0), math.sqrt(0.96 * 1.0), math.sqrt(0.98 * 0.9)]
    assert overall and overall[0].split("|")[3].strip() == bench.interval_text(per_start)
    assert "| gsp c=8 | 4 |" in pooled


def test_pool_refuses_files_it_cannot_read(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _run_file(tmp_path / "good.json", {"gsp c=1": [0.98, 0.99]})
    other = _run_file(tmp_path / "other.json", {"random c=8": [1.0, 1.0]})
    (tmp_path / "list.json").write_text("[1, 2]")
    for files, why in (
        ([good, other], "no level is in every file"),
        ([good, tmp_path / "list.json"], "not a bench_serving.py --json file"),
        ([tmp_path / "absent.json"], "absent.json"),
    ):
        with pytest.raises(SystemExit) as stop:
            bench.main(["--pool", *map(str, files)])
        assert stop.value.code == 2 and why in capsys.readouterr().err
    assert bench.main(["--pool", str(good)]) == 0  # control: one readable file prints its table
    assert "| gsp c=1 | 2 |" in capsys.readouterr().out


def test_a_control_run_starts_plain_upstream_in_both_slots(bench: ModuleType, tmp_path: Path) -> None:
    tenants = bench.write_tenants(tmp_path)
    iso = bench.BenchServer("iso", tenants, tmp_path)
    control = bench.BenchServer("iso", tenants, tmp_path, control=True)
    upstream = bench.BenchServer("upstream", tenants, tmp_path)
    try:
        # positive control: without --control the second slot is sglang-iso with the tenants file and its keys
        assert "sglang_iso.launch_server" in iso.server.argv and str(tenants.path) in iso.server.argv and iso.iso
        for server in (control, upstream):
            argv = server.server.argv
            assert "sglang_iso.baseline_server" in argv and str(tenants.path) not in argv and not server.iso, argv
            assert server.info_headers == {}
    finally:
        for server in (iso, control, upstream):
            server.stop()


def test_interleaved_requests_alternate_abba(bench: ModuleType) -> None:
    order = [bench.slot_of(k) for k in range(8)]
    assert order == [0, 1, 1, 0, 0, 1, 1, 0]
    for end in range(2, 65, 2):  # every even prefix: as many requests to each server
        assert sum(bench.slot_of(k) for k in range(end)) == end // 2


def test_split_route_drops_warmups_and_refuses_failures(bench: ModuleType) -> None:
    def row(k: int, slot: int, latency: float, success: bool = True, block: int = 0, start: float = 0.0) -> str:
        return json.dumps(
            {"k": k, "block": block if k >= 2 else -1, "slot": slot, "success": success, "start": start,
             "latency": latency, "ttft": latency / 4, "itl": [0.01] * 3, "error": "" if success else "refused"}
        )  # fmt: skip

    warmups = [row(0, 0, 9.0), row(1, 1, 9.0)]  # slow warm-ups, which would move both rates if counted
    lines = [*warmups, row(2, 1, 0.2, block=0), row(3, 0, 0.1, block=1), row(4, 0, 0.3, block=2)]
    lines.append(row(5, 1, 0.2, block=3))
    first, second = bench.split_route(lines)
    assert first.latencies == [0.1, 0.3] and first.rate == pytest.approx(5.0)  # one request a block: 1 / mean latency
    assert second.latencies == [0.2, 0.2] and second.rate == pytest.approx(5.0)
    assert first.ttfts == [0.025, 0.075] and len(second.itls) == 6
    # two blocks of two overlapping requests each: 4 requests over the blocks' spans (0.3 s + 0.5 s)
    blocks = [row(2, 0, 0.2, block=0, start=1.0), row(3, 0, 0.2, block=0, start=1.1)]
    blocks.append(row(4, 1, 0.1, block=1, start=2.0))
    blocks += [row(5, 0, 0.4, block=3, start=4.0), row(6, 0, 0.3, block=3, start=4.2)]
    assert bench.split_route([*warmups, *blocks])[0].rate == pytest.approx(4 / 0.8)
    with pytest.raises(RuntimeError, match="request 3 to slot 0 failed: refused"):
        bench.split_route([*warmups, row(2, 1, 0.2), row(3, 0, 0.1, success=False)])
    with pytest.raises(RuntimeError, match="slot 1 served no measured request"):
        bench.split_route([*warmups, row(3, 0, 0.1)])


def test_blocks_follow_the_warmups(bench: ModuleType) -> None:
    assert [bench.block_of(k, 3) for k in range(9)] == [-1, -1, 0, 0, 0, 1, 1, 1, 2]
    assert bench.block_size(0, 1) == 1 and bench.block_size(0, 8) == 48 and bench.block_size(5, 8) == 5


class FakePair:
    """Two local servers that stream a short answer the way SGLang's ``/generate`` does; what each request carried.

    The first answers its ready check 401 without one of ``first_keys`` (as sglang-iso's gate does)."""

    def __init__(self, first_keys: list[str]) -> None:
        self.seen: list[tuple[int, str | None, str]] = []  # (server, Authorization, the prompt's first 64 chars)
        self.seen_get: list[tuple[int, str | None]] = []
        self.in_flight = [0, 0]
        self.overlaps: list[tuple[int, int]] = []  # (own, other server's) requests in flight as each one arrived
        self.first_keys = [f"Bearer {k}" for k in first_keys]
        self.lock = threading.Lock()
        self.servers = [self._serve(0), self._serve(1)]
        self.urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers]

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()

    def _serve(self, index: int) -> http.server.ThreadingHTTPServer:
        pair = self

        class Generate(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body.get("text") if body.get("text") is not None else body.get("input_ids")
                prefix = prompt[:64] if isinstance(prompt, str) else str(prompt)[:64]
                with pair.lock:
                    pair.seen.append((index, self.headers.get("Authorization"), prefix))
                    pair.overlaps.append((pair.in_flight[index], pair.in_flight[1 - index]))
                    pair.in_flight[index] += 1
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    steps = int(body["sampling_params"]["max_new_tokens"])
                    for n in range(1, steps + 1):
                        chunk = {"text": "x" * n, "meta_info": {"completion_tokens": n, "prompt_tokens": 8}}
                        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                        time.sleep(0.001)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                finally:
                    with pair.lock:
                        pair.in_flight[index] -= 1

            def do_GET(self) -> None:  # the client's ready check (/v1/models) and its closing /server_info
                pair.seen_get.append((index, self.headers.get("Authorization")))
                keyed = index != 0 or self.headers.get("Authorization") in pair.first_keys  # (a gate's 401)
                ready = self.path == "/v1/models" and keyed
                self.send_response(200 if ready else 401 if not keyed else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"data": []}' if ready else b"{}")

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Generate)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


@pytest.mark.parametrize(("concurrency", "block"), [(1, 1), (2, 4)])
def test_interleaved_client_routes_each_block_with_its_servers_key(
    bench: ModuleType, tmp_path: Path, concurrency: int, block: int
) -> None:
    """The real sglang.bench_serving client process, against two local servers: each gets its blocks in ABBA order,
    with its own key or none, a block only once the other server has nothing in flight; the ready check asks the
    first server (which, like sglang-iso's gate, answers 401 without its key)."""
    pair = FakePair(["k-iso"])
    try:
        level = bench.Level("random", concurrency, 1)
        slots = [(pair.urls[0], ["k-iso"]), (pair.urls[1], [])]
        served = bench.run_interleaved(slots, level, seed=3, workdir=tmp_path, block=block)
    finally:
        pair.close()
    seen, seen_get, overlaps = pair.seen, pair.seen_get, pair.overlaps
    warm = bench.INTERLEAVE_WARMUPS
    # (the two warm-ups, one per server, run at once at concurrency 2)
    assert sorted(index for index, *_ in seen[:warm]) == sorted(bench.slot_of(k) for k in range(warm))
    expected = [bench.slot_of(j // block) for j in range(8 * block)]
    assert [index for index, *_ in seen[warm : warm + len(expected)]] == expected
    assert all(key == ("Bearer k-iso" if index == 0 else None) for index, key, _ in seen), seen
    assert seen_get and all(got == (0, "Bearer k-iso") for got in seen_get), seen_get  # the first slot, keyed
    per_server = len(seen[warm:]) // 2
    assert per_server >= level.prompts and [len(s.latencies) for s in served] == [per_server] * 2
    assert all(s.rate > 0 and len(s.itls) == len(s.ttfts) * 15 for s in served)
    assert all(other == 0 for _, other in overlaps[warm:]), overlaps  # never both servers at once
    if concurrency > 1:  # positive control: within a block the client's concurrency is used
        assert any(own > 0 for own, _ in overlaps[warm:]), overlaps


def test_interleaved_client_gives_each_shared_prefix_one_tenant_on_both_servers(
    bench: ModuleType, tmp_path: Path
) -> None:
    """A many-tenant level: every request of one shared prefix (a generated-shared-prefix group) carries the same
    tenant's key on either server (each server with its own keys), the tenants take turns; a keyless slot sends none."""
    level = bench.Level("gsp", 3, 3)
    pair = FakePair(["a0", "a1", "a2"])
    try:
        slots = [(pair.urls[0], ["a0", "a1", "a2"]), (pair.urls[1], ["b0", "b1", "b2"])]
        bench.run_interleaved(slots, level, seed=5, workdir=tmp_path, block=3)
    finally:
        pair.close()
    tenant: dict[str, set[str]] = {}
    servers: dict[str, set[int]] = {}
    for index, key, prefix in pair.seen:
        assert key is not None and key.startswith(f"Bearer {'ab'[index]}"), (index, key)
        tenant.setdefault(prefix, set()).add(key[-1])
        servers.setdefault(prefix, set()).add(index)
    assert len(tenant) == 8 and all(len(ids) == 1 for ids in tenant.values()), tenant  # one tenant per group
    assert {next(iter(ids)) for ids in tenant.values()} == {"0", "1", "2"}  # the tenants take turns
    assert any(seen_by == {0, 1} for seen_by in servers.values())  # (groups that both servers served)

    keyless = FakePair(["a0"])
    try:
        slots = [(keyless.urls[0], ["a0"]), (keyless.urls[1], [])]
        bench.run_interleaved(slots, level, seed=6, workdir=tmp_path, block=3)
    finally:
        keyless.close()
    assert {(index, key) for index, key, _ in keyless.seen} == {(0, "Bearer a0"), (1, None)}


def test_interleave_runs_every_level_in_blocks(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``main`` with ``--interleave``: each level of each round is one interleaved pair, blocks sized by its
    concurrency; another schedule is refused."""
    calls: list[tuple[str, int, str, int]] = []

    class Fake:
        def __init__(self, name: str, *args: object) -> None:
            self.name = name

        def start(self, seed: int) -> Fake:
            return self

        def stop(self) -> None:
            pass

    def pair(servers: dict, level: object, seed: int, first: str, logs: object, block: int) -> dict:
        calls.append((level.name, seed, first, block))  # type: ignore[attr-defined]
        cpu = dict.fromkeys(bench.CPU_ROLES, 1.0)
        made = bench.Batches(10, 2, 1.0, 1.0, 1)
        return {n: bench.LevelRun(5.0, [0.1, 0.2], [0.01], 50.0, made, cpu, {}) for n in servers}

    monkeypatch.setattr(bench, "BenchServer", Fake)
    monkeypatch.setattr(bench, "run_pair", pair)
    out = tmp_path / "pooled.json"
    argv = ["--interleave", "--rounds", "2", "--levels", "gsp:8,random:1,gsp:16x8", "--plot", "", "--json", str(out)]
    assert bench.main(argv) == 0
    per_round = [("gsp c=8", 48), ("random c=1", 1), ("gsp c=16 x8 tenants", 96)]
    assert [(name, block) for name, _, _, block in calls] == per_round * 2
    assert len({seed for _, seed, _, _ in calls}) == 6 and {first for *_, first, _ in calls} == {"upstream", "iso"}
    pooled = json.loads(out.read_text())
    assert pooled["iso"]["gsp c=8"]["throughput"] == [5.0, 5.0]
    with pytest.raises(SystemExit):
        bench.main(["--interleave", "--schedule", "sequential", "--levels", "gsp:8", "--plot", ""])


def test_step_counts_are_the_step_phase_s_calls_per_mode(bench: ModuleType) -> None:
    phases = {
        "run_batch": (10.0, 24), "run_batch@cpu": (9.0, 24), "run_batch/extend": (6.0, 4),
        "run_batch/extend@cpu": (5.5, 4), "run_batch/decode": (4.0, 20), "owner_check/decode": (0.1, 20),
        "model_runner.forward": (8.0, 24),
    }  # fmt: skip
    assert bench.step_counts(phases) == {"all": 24, "decode": 20, "extend": 4}
    assert bench.step_counts({}) == {}  # (without --phases: no steps)


def test_the_table_shows_steps_per_mode_when_both_servers_have_them(bench: ModuleType) -> None:
    level = bench.Level("gsp", 8, 1)
    results = {s: {level: bench.Samples()} for s in bench.SERVERS}
    made = bench.Batches(400, 50, 3.7, 7.3, 9)
    for name, decode in (("upstream", 380), ("iso", 390)):
        s = results[name][level]
        s.throughput, s.ttfts, s.itls, s.p99s, s.hit_pct = [30.0], [0.1, 0.2], [0.01], [0.2], [80.0]
        s.batches, s.cpu_ms = [made], [{"http": 3.0, "scheduler": 50.0}]
        s.steps = [{"all": decode + 50, "decode": decode, "extend": 50}]
    rows = bench.table(results, [level]).splitlines()
    decode_row = next(r for r in rows if "scheduler steps, decode" in r)
    assert "| 380.0 | 390.0 | 1.03 |" in decode_row, decode_row
    results["iso"][level].steps = []  # control: a server without steps shows no step rows
    assert not any("scheduler steps" in r for r in bench.table(results, [level]).splitlines())
