"""The stated layering, checked on the source: pure packages import no torch, Triton or SGLang, and only the
integration layer imports SGLang (``sglang.*``); the entry points may import anything."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sglang_iso"
PURE = ("audit", "cache", "identity", "tenancy", "server", "coverage.py", "names.py", "constants.py", "envvars.py",
        "settings.py", "observability.py", "models")  # fmt: skip
"""Importable without torch or SGLang: the tree, identities, tenants file, gate, coverage table, settings."""
HEAVY = ("torch", "triton", "sglang", "sglang_iso_kernels", "sglang_iso.integration", "sglang_iso.platform")
ENTRY_POINTS = ("cli.py", "launch_server.py", "baseline_server.py", "plugin.py", "__init__.py")


def imports_of(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def heavy(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in HEAVY)


def files_under(entry: str) -> list[Path]:
    target = PACKAGE / entry
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


def test_every_module_has_a_layer() -> None:
    top = {p.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*.py")}
    unplaced = top - set(PURE) - set(ENTRY_POINTS) - {"integration", "platform"}
    assert not unplaced, f"modules in no layer of this test: {sorted(unplaced)}"


@pytest.mark.parametrize("entry", PURE)
def test_pure_packages_import_no_torch_triton_or_sglang(entry: str) -> None:
    offending = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in files_under(entry)
        for name in imports_of(path)
        if heavy(name)
    }
    assert not offending, sorted(offending)


def test_only_the_integration_layer_imports_sglang() -> None:
    importers = {
        path.relative_to(PACKAGE).parts[0]
        for path in PACKAGE.rglob("*.py")
        for name in imports_of(path)
        if name == "sglang" or name.startswith("sglang.")
    }
    assert importers == {"integration"}, importers  # positive control: the scanner does see integration's imports


def test_e2e_modules_share_helpers_not_each_other() -> None:
    e2e = PACKAGE.parents[1] / "test" / "e2e"
    crossing = {
        f"{path.name}: {node.module}"
        for path in sorted(e2e.glob("test_*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1].startswith("test_")
    }
    helpers = {
        path.name
        for path in e2e.glob("test_*.py")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and node.module == "helpers" and node.level == 1
    }
    assert len(helpers) > 5, helpers  # positive control: the scanner sees the modules' relative imports
    assert not crossing, sorted(crossing)


def test_no_two_modules_share_a_name() -> None:
    """A module's file name says what it holds, once: ``gate.py`` is the gate, not also the code installing it."""
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
