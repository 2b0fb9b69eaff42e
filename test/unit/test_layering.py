"""The stated layering, checked on the source: pure packages import no torch, Triton or SGLang, and only the
integration layer imports SGLang (``sglang.*``); the entry points may import anything."""

from __future__ import annotations

import ast
from collections.abc import Collection
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, name: str, known: Collection[str]) -> set[str]:
    """Modules of ours ``path`` imports when it runs (module level or in a function); imports under ``if
    TYPE_CHECKING:`` are for the type checker only and are left out. ``from a import b`` counts ``a.b`` when that
    is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in known and m != name}


def test_the_import_graph_has_no_cycle() -> None:
    """Every import of ours, at module level or inside a function, points one way: a cycle (two modules
    needing each other) fails, naming its modules. Type-only imports do not count."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _runtime_imports(path, name, paths) for name, path in paths.items()}
    done: set[str] = set()

    def cycle_from(start: str) -> list[str] | None:
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        on_path = [start]
        while stack:
            node, todo = stack[-1]
            if not todo:
                stack.pop()
                on_path.pop()
                done.add(node)
                continue
            nxt = todo.pop()
            if nxt in on_path:
                return [*on_path[on_path.index(nxt) :], nxt]
            if nxt not in done:
                stack.append((nxt, sorted(graph[nxt])))
                on_path.append(nxt)
        return None

    cycles = [c for c in (cycle_from(n) for n in sorted(graph) if n not in done) if c]
    assert cycles == []
