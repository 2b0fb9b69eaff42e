"""The CUDA package set (requirements/cuda.txt) resolves on Linux x86_64 exactly as pinned, without a GPU.

pip's resolver runs in dry-run mode for the GPU image's platform (CPython 3.12, manylinux x86_64 up to glibc 2.36,
binary wheels only) against PyPI; its report must name exactly the pinned packages and versions, so an operator's
``pip install -r requirements/cuda.txt`` or the image's GPU build gets the versions we test. To regenerate the set
after changing requirements/gpu.txt, run the same command on gpu.txt (``resolve(GPU_TOP)`` below) and pin its report.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
CUDA_SET = ROOT / "requirements" / "cuda.txt"
GPU_TOP = ROOT / "requirements" / "gpu.txt"
RUNTIME = ROOT / "requirements" / "runtime.txt"
PYTHON_VERSION = "3.12"
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)] + ["manylinux2014_x86_64", "linux_x86_64"]
"""The image's base is Debian bookworm (glibc 2.36): every manylinux tag it can load."""
PIN = re.compile(r"^([A-Za-z0-9_.-]+)(\[[a-z0-9,_-]+\])?==([^\s;#]+)")


def pins(path: Path) -> dict[str, str]:
    """Normalized name -> version of every ``name==version`` line."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            out[normalize(match.group(1))] = match.group(3)
    return out


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pypi_reachable() -> bool:
    try:
        with socket.create_connection(("pypi.org", 443), timeout=5):
            return True
    except OSError:
        return False


def resolve(requirements: Path, report: Path, target: Path) -> subprocess.CompletedProcess[str]:
    platform_args = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--target", str(target),
        *platform_args, "--python-version", PYTHON_VERSION, "--implementation", "cp",
        "--abi", "cp312", "--abi", "abi3", "--abi", "none", "--only-binary=:all:",
        "-r", str(requirements), "--report", str(report),
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=1200)


def test_the_cuda_set_pins_the_gpu_requirements_and_the_cpu_sglang() -> None:
    cuda, top, runtime = pins(CUDA_SET), pins(GPU_TOP), pins(RUNTIME)
    assert top and all(cuda.get(name) == version for name, version in top.items()), {
        name: (version, cuda.get(name)) for name, version in top.items() if cuda.get(name) != version
    }
    assert cuda["sglang"] == runtime["sglang"]  # the GPU image serves the SGLang the CPU tests run


@pytest.mark.extended  # two minutes of pip resolving against PyPI; the pins are checked above
@pytest.mark.skipif(not pypi_reachable(), reason="pypi.org:443 is not reachable from this machine")
def test_pips_resolver_picks_exactly_the_cuda_set(tmp_path: Path) -> None:
    out = resolve(CUDA_SET, tmp_path / "report.json", tmp_path / "target")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    resolved = {normalize(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    expected = pins(CUDA_SET)
    assert resolved == expected, {
        "added by the resolver": sorted(set(resolved) - set(expected)),
        "pinned, not installed": sorted(set(expected) - set(resolved)),
        "other version": {n: (expected[n], v) for n, v in resolved.items() if n in expected and expected[n] != v},
    }
    assert any(name.startswith("nvidia-") for name in resolved)  # a CUDA build, not the CPU wheels
