"""Storage faults under the L3 page store: a writer killed mid-write, a full or read-only disk, torn and corrupted
files, an unwritable epochs file. Each fault must end in a miss (counted), never in another tenant's or a damaged
page, never in an exception in the scheduler; and the same store keeps serving its owner's good pages (the positive
control in every test)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglang_iso.integration import l3_store
from sglang_iso.integration.l3_store import FileL3Store

SECRET = b"f" * 32
FINGERPRINT = b"model-faults"
PAGE = 64


def owner_of(ns: str) -> str:
    return ns.split(":")[0]


def store(directory: Path) -> FileL3Store:
    return FileL3Store(directory, SECRET, FINGERPRINT, PAGE, owner_of)


def page(tag: int) -> bytes:
    return bytes([tag % 251]) * PAGE


WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from sglang_iso.integration import l3_store
    from test.integration.test_l3_faults import page, store

    directory, done = Path(sys.argv[1]), int(sys.argv[2])
    st = store(directory)
    for i in range(done):
        assert st.write("acme:1", b"d%d" % i, page(i))
    # NOTE: the next write stops between writing its temporary file and renaming it, where a kill hurts most.
    def stuck(src, dst):
        print("STUCK", flush=True)
        time.sleep(600)
    l3_store.os.replace = stuck
    st.write("acme:1", b"d%d" % done, page(done))
    """
)


def test_a_writer_killed_mid_write_leaves_only_whole_pages(tmp_path: Path) -> None:
    done = 5
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), *sys.path])}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), str(done)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "STUCK"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    partial = list(tmp_path.glob(".tmp-*"))
    assert len(partial) == 1 and partial[0].stat().st_size > 0  # the killed write's bytes, under no page name
    fresh = store(tmp_path)
    assert fresh.partial_removed == 0 and partial[0].exists()  # a young one may be another rank's write in progress
    old = time.time() - 3600
    os.utime(partial[0], (old, old))
    restarted = store(tmp_path)
    assert restarted.partial_removed == 1 and not partial[0].exists()
    assert (restarted.foreign_files, restarted.bad_files, len(restarted.index)) == (0, 0, done)
    for i in range(done):  # positive control: every whole page comes back, byte for byte
        assert restarted.read("acme:1", b"d%d" % i) == page(i)
    assert restarted.read("acme:1", b"d%d" % done) is None  # the killed write is a miss
    assert restarted.read("globex:1", b"d0") is None  # never another tenant's


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EIO])
def test_a_failed_write_stores_nothing_and_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    st = store(tmp_path)
    assert st.write("acme:1", b"kept", page(1))
    real = l3_store.tempfile.mkstemp

    def failing(*args: object, **kwargs: object) -> tuple[int, str]:
        fd, name = real(*args, **kwargs)  # type: ignore[call-overload]
        os.close(fd)
        os.unlink(name)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(l3_store.tempfile, "mkstemp", failing)
    assert st.write("acme:1", b"lost", page(2)) is False  # no exception reaches the scheduler
    assert st.status()["l3_write_failures"] == 1 and "lost" not in str(st.index)
    assert st.read("acme:1", b"lost") is None and list(tmp_path.glob(".tmp-*")) == []
    assert st.read("acme:1", b"kept") == page(1)  # what was stored before still serves
    monkeypatch.setattr(l3_store.tempfile, "mkstemp", real)
    assert st.write("acme:1", b"lost", page(2)) and st.read("acme:1", b"lost") == page(2)  # space again: stored


def test_a_failed_write_after_the_temporary_file_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = store(tmp_path)

    def full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(l3_store.os, "replace", full)
    assert st.write("acme:1", b"d", page(3)) is False
    assert list(tmp_path.glob(".tmp-*")) == [] and list(tmp_path.glob("*.kv")) == []
    monkeypatch.undo()
    assert st.write("acme:1", b"d", page(3)) and st.read("acme:1", b"d") == page(3)


def test_torn_and_truncated_files_are_counted_misses(tmp_path: Path) -> None:
    st = store(tmp_path)
    for i in range(4):
        assert st.write("acme:1", b"d%d" % i, page(i))
    files = {i: tmp_path / st.name("acme:1", b"d%d" % i) for i in range(4)}
    data = files[0].read_bytes()
    files[0].write_bytes(data[: len(data) // 2])  # torn by a power loss
    files[1].write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped in the tag
    files[2].write_bytes(b"")  # zero length (a file system without data journaling)
    restarted = store(tmp_path)
    assert restarted.foreign_files == 3  # never indexed, never read as KV
    for i in range(3):
        assert restarted.read("acme:1", b"d%d" % i) is None
    assert restarted.bad_files == 3
    assert restarted.read("acme:1", b"d3") == page(3)  # positive control: the intact file serves


def test_an_unpersisted_flush_still_holds_and_its_later_pages_do_not_survive_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = store(tmp_path)
    assert st.write("acme:1", b"old", page(1)) and st.write("globex:1", b"g", page(2))

    def read_only(self: FileL3Store, path: Path, data: bytes, *, durable: bool = False) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(FileL3Store, "_atomic_write", read_only)
    assert st.flush("owner:acme") == 1  # no exception: the scheduler's flush command completes
    assert st.status()["l3_epoch_write_failures"] == 1
    assert st.read("acme:1", b"old") is None  # the flush holds in this process
    assert st.read("globex:1", b"g") == page(2)  # positive control: the other tenant keeps its page
    monkeypatch.undo()
    assert st.write("acme:1", b"new", page(3)) and st.read("acme:1", b"new") == page(3)
    restarted = store(tmp_path)  # the epochs file still holds the epoch before the flush
    assert restarted.read("acme:1", b"old") is None  # deleted by the flush
    assert restarted.read("acme:1", b"new") is None and restarted.stale_removed == 1  # fail closed
    assert restarted.read("globex:1", b"g") == page(2)


@pytest.mark.parametrize("content", ["", "{not json", '{"x": "y"}', "[1, 2]"])
def test_a_damaged_epochs_file_stops_the_store_naming_it(tmp_path: Path, content: str) -> None:
    st = store(tmp_path)
    assert st.write("acme:1", b"d", page(1))
    epochs = st._epochs_path
    assert epochs.is_file() and store(tmp_path).read("acme:1", b"d") == page(1)  # control: intact, it opens
    epochs.write_text(content)
    with pytest.raises(RuntimeError, match=epochs.name):
        store(tmp_path)  # NOTE: without the epochs, flushed pages could come back: refuse to start
