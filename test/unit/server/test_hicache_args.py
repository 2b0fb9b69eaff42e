"""Launcher rules for the hierarchical cache: CPU defaults, L3 taken over from SGLang, refusals."""

from __future__ import annotations

import pytest

from sglang_iso.server.args import plan_launch
from sglang_iso.server.hicache_args import L3_DIR_ENV, UPSTREAM_DIR_ENV, plan_hicache

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
        assert env == [(L3_DIR_ENV, str(tmp_path.resolve()))]
    plan = plan_launch([*HI, "--hicache-storage-backend", "file", "--tenants-file", "t.toml"], cuda_available=True)
    assert "--hicache-storage-backend" not in plan.sglang_argv
    assert dict(plan.env_added)[L3_DIR_ENV] == "/tmp/hicache"


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
        plan_hicache(argv, cuda_available=True, tenants_file=tenants, env={})
    assert "--hicache-storage-backend" in str(err.value)
