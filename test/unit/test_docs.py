"""The docs name what the code has: every admin route in the README's table, every file the design notes walk."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "sglang_iso"
ROUTES = PACKAGE / "integration" / "front" / "routes.py"


def admin_routes() -> set[tuple[str, str]]:
    """(method, path) of every ``/iso/*`` route the front end adds to SGLang's app."""
    found = re.findall(r'add_api_route\("(/iso[^"]*)", \w+, methods=\["(\w+)"\]\)', ROUTES.read_text())
    return {(method, path) for path, method in found}


def test_every_admin_route_is_in_the_readme_table() -> None:
    routes = admin_routes()
    assert len(routes) >= 5, "routes.py changed shape: the route pattern found too few routes"
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("Admin endpoints of sglang-iso:") :]
    rows = set(re.findall(r"^\| `(GET|POST) (/iso/[a-z_/{}]+)", table, re.M))
    assert routes - rows == set(), f"admin routes missing from the README table: {sorted(routes - rows)}"
    assert rows - routes == set(), f"README lists admin routes the server does not have: {sorted(rows - routes)}"


def test_every_file_the_design_notes_name_exists() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_0-9]+\.py)`", design))
    assert len(named) > 30, "the design notes name fewer files than the request path has"
    roots = (PACKAGE, ROOT, ROOT / "python", ROOT / "testing", ROOT / "sgl-kernel-patches" / "sglang_iso_kernels")
    missing = sorted(n for n in named if not any((r / n).exists() for r in roots) and not _in_package(n))
    assert missing == [], f"docs/design.md names files that do not exist: {missing}"


def _in_package(name: str) -> bool:
    """A bare file name the notes use inside a folder they just named (``tenant_cache.py`` for integration/)."""
    return "/" not in name and any(PACKAGE.rglob(name))
