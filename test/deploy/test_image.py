"""The image's file set: what the Dockerfile copies (minus .dockerignore) holds every package pyproject maps.

The image installs sglang-iso with ``pip install --no-deps -e .`` from the files its ``COPY`` lines bring in;
setuptools refuses a mapped package directory that is not there, and the runtime imports the kernels. This
rebuilds that file set in a temporary directory and checks both, without Docker.
"""

from __future__ import annotations

import fnmatch
import shutil
import site
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Whether ``rel`` (or a folder above it) matches a .dockerignore pattern (``**/`` matches any depth)."""
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        head = "/".join(parts[:i])
        for pattern in patterns:
            if fnmatch.fnmatch(head, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatch(parts[i - 1], pattern[len("**/") :])
            ):
                return True
    return False


def image_files(into: Path) -> Path:
    """Copy what the Dockerfile's COPY lines copy (honouring .dockerignore) under ``into``; returns ``into``."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
            continue
        *sources, dest = words[1:]
        for source in sources:
            src = ROOT / source.rstrip("/")
            target = into / dest if dest.endswith("/") and not source.endswith("/") else into / dest.rstrip("/")
            files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
            for f in files:
                rel = f.relative_to(ROOT).as_posix()
                if _ignored(rel, patterns):
                    continue
                out = target / f.name if src.is_file() else target / f.relative_to(src)
                if dest in ("./", "."):
                    out = into / f.name
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, out)
    return into


def test_every_package_pyproject_maps_is_in_the_image(tmp_path: Path) -> None:
    tree = image_files(tmp_path)
    setup = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs: dict[str, str] = setup["package-dir"]
    missing = []
    for package in setup["packages"]:
        top = package.split(".")[0]
        if top in dirs:
            where = Path(dirs[top], *package.split(".")[1:])
        else:
            where = Path(dirs.get("", "."), *package.split("."))
        if not (tree / where / "__init__.py").is_file():
            missing.append(f"{package} ({where})")
    assert not missing, f"packages the Dockerfile does not copy: {missing}"
    assert (tree / "python/sglang_iso/models/tiny-llama/model.safetensors").is_file()
    assert not list(tree.rglob("tenants.toml")) and not list(tree.rglob("*.key"))  # no secrets in the image
    assert not list(tree.rglob("sglang_iso_testing")) and not list(tree.rglob("plant.py"))  # nor the test harness
    assert "sglang_iso_testing" not in setup["packages"]


def test_the_image_file_set_imports_the_runtime_and_its_kernels(tmp_path: Path) -> None:
    tree = image_files(tmp_path)
    setup = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]
    # NOTE: -S: this checkout's editable install (a .pth finder) must not answer for the image's copy.
    roots = {str(tree / d if name == "" else (tree / d).parent) for name, d in setup["package-dir"].items()}
    paths = [*sorted(roots), *site.getsitepackages()]
    code = "import sglang_iso.plugin, sglang_iso_kernels; print(sglang_iso_kernels.__file__)"
    out = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {paths!r}; {code}"],
        capture_output=True, text=True, timeout=300, cwd=tree,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(tree))  # the image's copy, not this checkout's
