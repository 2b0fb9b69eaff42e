"""Launcher rules for the hierarchical cache: CPU defaults, L3 taken over from SGLang, refusals."""

from __future__ import annotations

import pytest

from sglang_iso.server.args import plan_launch
from sglang_iso.server.hicache_args import (
    DEFAULT_L3_MAX_GB,
    L3_DIR_ENV,
    L3_MAX_BYTES_ENV,
    UPSTREAM_DIR_ENV,
    plan_hicache,
)

HI = ["--model-path", "m", "--enable-hierarchical-cache"]


def test_cpu_defaults_only_with_hicache_and_without_cuda() -> None:
    argv, added, env = plan_hicache(HI, cuda_available=False, tenants_file=None, env={})
    assert added == ["--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"] and env == []
    assert argv == [*HI, *added]
    assert plan_hicache(HI, cuda_available=True, tenants_file=None, env={})[1] == []
    assert plan_hicache(["--model-path", "m"], cuda_available=False, tenants_file=None, env={})[1] == []
    given = [*HI, "--hicache-mem-layout=page_first"]
    assert plan_hicache(given, cuda_available=False, tenants_file=None, env={})[1] == ["--hicache-io-backend", "direct"]


def test_file_backend_goes_to_our_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for flags in (["--hicache-storage-backend", "file"], ["--hicache-storage-backend=file"]):
        argv, _, env = plan_hicache(
            [*HI, *flags], cuda_available=True, tenants_file="t.toml", env={UPSTREAM_DIR_ENV: str(tmp_path)}
        )
        assert "--hicache-storage-backend" not in " ".join(argv) and "file" not in argv
        assert env == [(L3_DIR_ENV, str(tmp_path.resolve())), (L3_MAX_BYTES_ENV, str(int(DEFAULT_L3_MAX_GB) << 30))]
    plan = plan_launch([*HI, "--hicache-storage-backend", "file", "--tenants-file", "t.toml"], cuda_available=True)
    assert "--hicache-storage-backend" not in plan.sglang_argv
    assert dict(plan.env_added)[L3_DIR_ENV] == "/tmp/hicache"
    capped = plan_launch(
        [*HI, "--hicache-storage-backend", "file", "--tenants-file", "t.toml", "--iso-l3-max-gb", "0.5"],
        cuda_available=True,
    )
    assert dict(capped.env_added)[L3_MAX_BYTES_ENV] == str(1 << 29)


@pytest.mark.parametrize("value", ["0", "-1", "lots", "nan", "inf"])
def test_l3_cap_must_be_a_positive_size(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*HI, "--hicache-storage-backend", "file", "--tenants-file", "t.toml", "--iso-l3-max-gb", value]
    with pytest.raises(SystemExit):
        plan_launch(argv, cuda_available=True)
    assert "--iso-l3-max-gb" in capsys.readouterr().err


def test_l3_cap_without_l3_is_refused() -> None:
    with pytest.raises(ValueError, match="--iso-l3-max-gb needs --hicache-storage-backend file"):
        plan_launch([*HI, "--iso-l3-max-gb", "1"], cuda_available=True)


@pytest.mark.parametrize(
    ("argv", "tenants", "message"),
    [
        ([*HI, "--hicache-storage-backend", "mooncake"], "t.toml", "'mooncake' is not supported"),
        ([*HI, "--hicache-storage-backend", "file"], None, "needs --tenants-file"),
        (["--model-path", "m", "--hicache-storage-backend", "file"], "t.toml", "needs --enable-hierarchical-cache"),
    ],
)
def test_refusals_name_the_flag(argv: list[str], tenants: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        plan_launch([*argv, *(["--tenants-file", tenants] if tenants else [])], cuda_available=True, env={})
    assert "--hicache-storage-backend" in str(err.value)


def test_launcher_refuses_a_malformed_tier_quota_naming_the_field(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from sglang_iso.launch_server import main
    from sglang_iso_testing.tenants import write_tenants_file

    made = write_tenants_file(tmp_path, {"acme": {"l3_quota_tokens": "lots"}})
    tenants = made.path
    argv = [*HI, "--hicache-storage-backend", "file", "--tenants-file", str(tenants), "--iso-dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "tenants[0].l3_quota_tokens" in err and "got string" in err
    write_tenants_file(tmp_path, {"acme": {"l3_quota_tokens": 4096}}, keys=made.keys, secret=made.secret)
    assert main(argv) == 0  # control: the same file with a valid value starts
