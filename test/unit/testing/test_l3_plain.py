"""The benchmark's plaintext L3 stand-in: same file size and authentication as the encrypted store, bytes in clear."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_iso.integration.l3_store import FileL3Store
from sglang_iso_testing import l3_plain

PAGE = bytes(range(256)) * 4


def _store(directory: Path) -> FileL3Store:
    return FileL3Store(directory, b"s" * 32, b"model", len(PAGE), lambda ns: ns.split(":")[0])


def test_plaintext_pages_are_in_clear_authenticated_and_the_same_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    enc_dir, plain_dir = tmp_path / "enc", tmp_path / "plain"
    enc_dir.mkdir()
    plain_dir.mkdir()
    enc = _store(enc_dir)
    assert enc.write("acme:1", b"d", PAGE)
    monkeypatch.setattr(FileL3Store, "_cipher", FileL3Store._cipher)  # undone after the test
    l3_plain.register()
    plain = _store(plain_dir)
    assert plain.write("acme:1", b"d", PAGE) and plain.read("acme:1", b"d") == PAGE
    enc_file, plain_file = next(enc_dir.glob("*.kv")), next(plain_dir.glob("*.kv"))
    assert enc_file.stat().st_size == plain_file.stat().st_size
    assert PAGE in plain_file.read_bytes() and PAGE[:64] not in enc_file.read_bytes()  # control: encrypted
    flipped = bytearray(plain_file.read_bytes())
    flipped[-40] ^= 1  # a payload byte
    plain_file.write_bytes(bytes(flipped))
    assert plain.read("acme:1", b"d") is None and plain.bad_files == 1
