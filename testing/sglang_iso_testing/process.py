"""Run a server as a child process: start, wait for /health, show its log, stop.

Used by the demo, the test fixtures and the benchmarks. The child gets its own
process group, and :meth:`ServerProcess.stop` kills the whole group, so no
scheduler or detokenizer is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_iso import envvars

_PORTS = range(20000, 32000)
"""Below Linux's default ephemeral range (32768-60999): no outgoing connection takes a port handed out here between
the check and the server's bind (port 0 would hand out an ephemeral port, which any client socket may take)."""
_HANDED: set[int] = set()


def free_port() -> int:
    """A loopback port that binds now, not handed out before by this process."""
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(_PORTS.start, _PORTS.stop)
        if port in _HANDED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED.add(port)
        return port
    with socket.socket() as s:  # NOTE: that range is full: fall back to what the kernel picks
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CPU_ROLES = ("http", "scheduler", "detokenizer", "all")
"""The processes :meth:`ServerProcess.cpu_seconds` reads (``all``: every process of the server)."""


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message has its log tail."""


class ServerProcess:
    """A server started with ``argv`` (a full command line) on ``port``.

    Args:
        argv: the command, e.g. ``[sys.executable, "-m", "sglang_iso.launch_server", ...]``.
        port: the port it listens on (must match ``--port`` in argv).
        log_path: where stdout and stderr go; a temp file if None, removed by :meth:`stop` unless
            ``keep_log`` is set (it is set when the server fails to start; test reports set it on failure).
    """

    def __init__(
        self, argv: Sequence[str], port: int, *, log_path: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.owns_log = log_path is None
        self.keep_log = False
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="sglang-iso-server-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = log_path
        # NOTE: TRITON_INTERPRET is a test-process setting for kernel tests; a server must not inherit it.
        inherited = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.env = {**inherited, **(env or {})}
        # NOTE: SGLang names its IPC sockets and Prometheus directory with ``tempfile``; a killed server leaves them
        # behind. Its own temporary directory (unless the caller chose TMPDIR) goes with it in :meth:`stop`.
        self.scratch: Path | None = None
        if "TMPDIR" not in (env or {}):
            self.scratch = Path(tempfile.mkdtemp(prefix="sglang-iso-srv-"))
            self.env["TMPDIR"] = str(self.scratch)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> ServerProcess:
        """Start the process and wait until /health answers 200.

        Raises:
            ServerStartError: the process exited, or ``timeout_s`` passed.
        """
        if self.scratch is not None:
            self.scratch.mkdir(exist_ok=True)  # (again, for a server started after a stop)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.keep_log = True
                raise ServerStartError(f"server exited with code {self.proc.returncode}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        self._record_start(time.monotonic() - started)
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        self.keep_log = True
        self.stop()
        raise ServerStartError(f"server not healthy after {timeout_s:.0f}s\n{self.log_tail()}")

    def _record_start(self, seconds: float) -> None:
        """Append how long the start took to ``$SGLANG_ISO_START_LOG`` (a JSON line per start), when set: where a
        test run spends its time starting servers."""
        path = envvars.START_LOG.get()
        if not path:
            return
        row = {"seconds": round(seconds, 1), "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "argv": self.argv[1:4]}
        with contextlib.suppress(OSError), open(path, "a") as out:
            out.write(json.dumps(row) + "\n")

    def stop(self) -> None:
        """Kill the whole process group (SIGTERM, then SIGKILL); remove its temporary files, and a temp log
        unless ``keep_log``."""
        self._kill()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        if self.owns_log and not self.keep_log:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def _kill(self) -> None:
        if self.proc is None:
            return
        # NOTE: the group id is the launcher's pid (start_new_session), known even when the launcher has exited:
        # asking the OS for it then fails, and its scheduler and detokenizer would be left busy-polling. Linux does
        # not reuse a pid while a process group of that id has members.
        # SIGKILL at once: on SIGTERM the scheduler and detokenizer die by the signal, and SGLang's launcher then
        # treats that as a crashed child (SIGQUIT), sleeps 5 s "before crash diagnostics" and kills the group
        # itself; a SIGTERM bought nothing but those 5 s. What a server must keep (audit lines, L3 files) is
        # written while it serves, never at exit; tests of a graceful stop signal the process themselves.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10.0)

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cpu_seconds(self) -> dict[str, float]:
        """User + system CPU seconds so far of the server's processes, by :data:`CPU_ROLES`: the HTTP process (the
        one started), SGLang's scheduler and detokenizer (by their process titles), and all of them together."""
        import psutil

        out = dict.fromkeys(CPU_ROLES, 0.0)
        for proc, role in self.processes():
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            seconds = times.user + times.system
            if role is not None:
                out[role] += seconds
            out["all"] += seconds
        return out

    def processes(self) -> list[tuple[Any, str | None]]:
        """Every process of the server (``psutil.Process``) with its role in :data:`CPU_ROLES` (``http``,
        ``scheduler``, ``detokenizer``), or None for the others (e.g. multiprocessing's resource tracker)."""
        import psutil

        if self.proc is None:
            raise RuntimeError("server not started")
        main = psutil.Process(self.proc.pid)
        out: list[tuple[Any, str | None]] = []
        for proc in (main, *main.children(recursive=True)):
            try:
                name = proc.name()
            except psutil.NoSuchProcess:
                continue
            out.append((proc, "http" if proc.pid == main.pid else next((r for r in CPU_ROLES[1:3] if r in name), None)))
        return out

    def post(
        self, path: str, payload: dict[str, Any], *, headers: dict[str, str] | None = None, timeout_s: float = 120.0
    ) -> tuple[int, Any]:
        """POST JSON; returns (status, decoded JSON or text)."""
        return request_json(self.base_url + path, payload, headers=headers, timeout_s=timeout_s)

    def freeze_gc(self) -> None:
        """Freeze the collector in every process of a server without the tenant gate, as SGLang does after its warm-up.

        :data:`IDLE_FLAGS` skip the warm-up, and SGLang then posts ``/freeze_gc`` as the server starts listening:
        when the call comes first it fails (connection refused), and every process keeps collecting its whole
        start-up heap (full collections of the HTTP process stall its event loop for most of a second). sglang-iso's
        gate makes that call once it listens; benchmarks call this on the servers it does not guard, so the
        comparison server runs as upstream does by default.
        """
        status, body = self.post("/freeze_gc", {})
        if status != 200:
            raise RuntimeError(f"/freeze_gc answered {status}: {str(body)[:200]}")

    def get(self, path: str, *, timeout_s: float = 30.0) -> tuple[int, Any]:
        return request_json(self.base_url + path, None, timeout_s=timeout_s)

    def get_with(self, path: str, headers: dict[str, str], *, timeout_s: float = 30.0) -> tuple[int, Any]:
        return request_json(self.base_url + path, None, headers=headers, timeout_s=timeout_s)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def request_json(
    url: str, payload: dict[str, Any] | None, *, headers: dict[str, str] | None = None, timeout_s: float = 120.0
) -> tuple[int, Any]:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if payload is None else "POST")
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode(errors="replace")


def iso_server_argv(port: int, model_path: Path | str, *extra: str) -> list[str]:
    """Command line for sglang-iso's launcher on ``port`` (loopback, :data:`IDLE_FLAGS`)."""
    return _server_argv("sglang_iso.launch_server", port, model_path, extra)


def baseline_server_argv(port: int, model_path: Path | str, *extra: str) -> list[str]:
    """Command line for plain upstream SGLang (the comparison baseline) on ``port``."""
    return _server_argv("sglang_iso.baseline_server", port, model_path, extra)


IDLE_FLAGS = ("--skip-server-warmup", "--sleep-on-idle")
"""On every server the harness starts: no warmup request, and a fully idle scheduler waits on its sockets (SGLang's
``--sleep-on-idle``; a request wakes it at once) instead of busy-polling half a core, which on a 2-core machine
slows whatever else runs, the other servers of a test included."""


def _server_argv(module: str, port: int, model_path: Path | str, extra: tuple[str, ...]) -> list[str]:
    host = ["--host", "127.0.0.1", "--port", str(port)]
    return [sys.executable, "-m", module, "--model-path", str(model_path), *host, *IDLE_FLAGS, *extra]
