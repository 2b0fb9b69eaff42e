"""The interpreter-start hook: `import sglang` and `import torchvision` work in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_iso import envvars
from sglang_iso.platform import startup

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the hook only matters on a CPU-only torch")


def _fresh(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    # NOTE: the hook is part of the environment, not of this test process: a clean interpreter, no PYTHONSTARTUP.
    clean = {k: v for k, v in os.environ.items() if k not in (envvars.NO_CPU_HOOK.name, "SGLANG_USE_CPU_ENGINE")}
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=300
    )


def test_the_environment_has_the_hook() -> None:
    assert startup.pth_path().read_text() == startup.PTH_LINE


def test_import_sglang_first_then_the_frontend_language() -> None:
    out = _fresh("import sglang as sgl\n@sgl.function\ndef f(s):\n    s += 'x'\nprint(type(f).__name__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "SglFunction"


def test_import_torchvision_first() -> None:
    out = _fresh("import torchvision, sys; print('sglang_iso.platform.cpu' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_without_the_hook_torchvision_fails() -> None:
    # Negative control: the hook, nothing else, is what makes the imports above work.
    out = _fresh("import torchvision", **{envvars.NO_CPU_HOOK.name: "1"})
    assert out.returncode != 0
    assert "torchvision::nms" in out.stderr


def test_a_plain_interpreter_pays_nothing() -> None:
    out = _fresh("import sys; print(sorted(m for m in ('torch', 'sglang', 'torchvision') if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_sglang_launch_server_help() -> None:
    out = _fresh(
        "import runpy, sys; sys.argv = ['x', '--help']; runpy.run_module('sglang.launch_server', run_name='__main__')"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--model-path" in out.stdout


def test_pth_line_survives_a_missing_package(tmp_path: Path) -> None:
    pth = startup.write_pth(str(tmp_path))
    code = f"import site, sys; sys.modules['sglang_iso'] = None; site.addsitedir({str(tmp_path)!r}); print('ok')"
    out = _fresh(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok" and not out.stderr, out.stderr
    assert startup.remove_pth(str(tmp_path)) and not pth.exists()


def test_install_is_idempotent_and_uninstall_removes_the_finder() -> None:
    before = list(sys.meta_path)
    try:
        startup.uninstall()
        # sglang is already imported in this process: too late, the finder stays out.
        assert not startup.install()
        assert not any(isinstance(f, startup.ShimOnFirstImport) for f in sys.meta_path)
    finally:
        sys.meta_path[:] = before
