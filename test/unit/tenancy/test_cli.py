"""Tests for ``sglang-iso keys ...`` and ``sglang-iso check-config``, called as functions."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sglang_iso.tenancy import KeyIndex, Principal, key_sha256, load_tenants_file
from sglang_iso.tenancy.operator_commands import check_config_main, keys_main, main

from .conftest import ACME_HASH, ACME_KEY, VALID_BODY, WriteTenants


def run_keys(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = keys_main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


# --- keys new ----------------------------------------------------------------------------------------------------


def test_keys_new_tenant_prints_key_then_paste_line(
    capsys: pytest.CaptureFixture[str], write_tenants: WriteTenants
) -> None:
    code, lines, err = run_keys(capsys, "new", "--tenant", "fresh")
    assert code == 0
    assert len(lines) == 2
    key, paste = lines
    assert key.startswith("sk-iso-")
    assert paste == f'key_sha256 = ["{key_sha256(key)}"]'
    assert "only once" in err and 'id = "fresh"' in err
    # The paste line really is ready to paste.
    index = KeyIndex(load_tenants_file(write_tenants(f'\n[[tenants]]\nid = "fresh"\n{paste}\n')))
    assert index.lookup(key) == Principal.for_tenant("fresh")


def test_keys_new_admin(capsys: pytest.CaptureFixture[str], write_tenants: WriteTenants) -> None:
    code, lines, _ = run_keys(capsys, "new", "--admin")
    assert code == 0
    key, paste = lines
    assert paste == f'admin_key_sha256 = ["{key_sha256(key)}"]'
    body = f'\n[[tenants]]\nid = "acme"\nkey_sha256 = ["{ACME_HASH}"]\n'
    index = KeyIndex(load_tenants_file(write_tenants(body, header=f'namespace_secret_file = "secret.key"\n{paste}\n')))
    assert index.lookup(key) == Principal.for_admin()


def test_keys_new_fresh_each_time(capsys: pytest.CaptureFixture[str]) -> None:
    first = run_keys(capsys, "new", "--tenant", "acme")[1][0]
    second = run_keys(capsys, "new", "--tenant", "acme")[1][0]
    assert first != second


@pytest.mark.parametrize("tenant", ["Acme", "-acme", "a" * 65, "ac_me", ""])
def test_keys_new_rejects_bad_tenant_id(capsys: pytest.CaptureFixture[str], tenant: str) -> None:
    code, lines, err = run_keys(capsys, "new", f"--tenant={tenant}")
    assert code == 1
    assert lines == []
    assert "--tenant" in err and "invalid tenant id" in err


@pytest.mark.parametrize("argv", [["new"], ["new", "--tenant", "acme", "--admin"], [], ["rotate"]])
def test_keys_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, lines, err = run_keys(capsys, *argv)
    assert code == 2
    assert lines == []
    assert "usage: sglang-iso keys" in err


def test_keys_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run_keys(capsys, "--help")
    assert code == 0
    assert lines[0].startswith("usage: sglang-iso keys")


# --- keys hash ---------------------------------------------------------------------------------------------------


def test_keys_hash_reads_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(ACME_KEY + "\n"))
    code, lines, _ = run_keys(capsys, "hash")
    assert (code, lines) == (0, [ACME_HASH])


@pytest.mark.parametrize("stdin", ["", "\n", "a\nb\n", "sk iso\n"])
def test_keys_hash_rejects_bad_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, stdin: str
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code, lines, err = run_keys(capsys, "hash")
    assert code == 1
    assert lines == []
    assert err.startswith("error:")


# --- check-config ------------------------------------------------------------------------------------------------


def test_check_config_ok(capsys: pytest.CaptureFixture[str], write_tenants: WriteTenants) -> None:
    path = write_tenants(VALID_BODY)
    assert check_config_main([str(path)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{path}: 3 tenants, 2 shared prefixes, 1 admin key, 1 cache group: OK\n"
    assert err == ""


def test_check_config_does_not_print_secret(
    capsys: pytest.CaptureFixture[str], write_tenants: WriteTenants, secret_bytes: bytes
) -> None:
    assert check_config_main([str(write_tenants(VALID_BODY))]) == 0
    out, err = capsys.readouterr()
    assert secret_bytes.hex() not in out + err


def test_check_config_error(capsys: pytest.CaptureFixture[str], write_tenants: WriteTenants) -> None:
    path = write_tenants('\n[[tenants]]\nid = "Bad"\nkey_sha256 = []\n')
    assert check_config_main([str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: {path}:5: tenants[0].id: invalid tenant id")


def test_check_config_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert check_config_main([str(tmp_path / "missing.toml")]) == 1
    assert "cannot read tenants file" in capsys.readouterr().err


def test_check_config_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_config_main([]) == 2
    assert "usage: sglang-iso check-config" in capsys.readouterr().err


# --- dispatcher --------------------------------------------------------------------------------------------------


def test_main_dispatches(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, write_tenants: WriteTenants
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(ACME_KEY))
    assert main(["keys", "hash"]) == 0
    assert capsys.readouterr().out == ACME_HASH + "\n"
    assert main(["check-config", str(write_tenants(VALID_BODY))]) == 0
    assert capsys.readouterr().out.endswith(": OK\n")
    assert main([]) == 2
    assert main(["serve"]) == 2


def test_check_config_catches_adapter_errors(capsys: pytest.CaptureFixture[str], write_tenants: WriteTenants) -> None:
    body = f'\n[[tenants]]\nid = "acme"\nkey_sha256 = ["{ACME_HASH}"]\nadapters = ["ok", "not ok"]\n'
    assert check_config_main([str(write_tenants(body))]) == 1
    err = capsys.readouterr().err
    assert ":7: tenants[0].adapters[1]: invalid adapter name 'not ok'" in err
