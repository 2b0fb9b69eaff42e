"""Every ``SGLANG_ISO_*`` name the packages mention is declared in ``sglang_iso.envvars``, and read through it."""

from __future__ import annotations

import re
from pathlib import Path

from sglang_iso import envvars

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "python" / "sglang_iso", ROOT / "testing" / "sglang_iso_testing", ROOT / "sgl-kernel-patches")
NAME = re.compile(r"SGLANG_ISO_[A-Z0-9_]*[A-Z0-9]")
HOME = ROOT / "python" / "sglang_iso" / "envvars.py"


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted(pkg.rglob("*.py")) if p != HOME]


def test_every_name_in_the_packages_is_declared() -> None:
    undeclared = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in _sources()
        for name in NAME.findall(path.read_text())
        if name not in envvars.BY_NAME
    }
    assert sorted(undeclared) == []


def test_no_module_spells_a_name_in_code() -> None:
    # Docstrings and help texts may name a variable; assignments and environment reads go through envvars.
    spelled = re.compile(
        r"""(^\s*[A-Za-z_][\w.]*\s*(:[^=\n]+)?=\s*|environ(\.get)?\(\s*|environ\[\s*|getenv\(\s*)["']SGLANG_ISO_""",
        re.MULTILINE,
    )
    offenders = [str(p.relative_to(ROOT)) for p in _sources() if spelled.search(p.read_text())]
    assert offenders == []


def test_every_declared_variable_is_used() -> None:
    text = "\n".join(p.read_text() for p in _sources())
    # NOTE: SECRET is a conventional name a tenants file points at (namespace_secret_env), never read by name.
    unused = [v.name for v in envvars.ALL if v is not envvars.SECRET and not re.search(rf"envvars\.{_attr(v)}\b", text)]
    assert unused == []


def test_declarations_are_complete() -> None:
    assert len(envvars.BY_NAME) == len(envvars.ALL)
    for var in envvars.ALL:
        assert var.name.startswith("SGLANG_ISO_") and var.meaning and var.set_by in ("operator", "launcher", "harness")
    assert envvars.KV_SCRUB.get({}) == "on-free" and envvars.KV_SCRUB.get({"SGLANG_ISO_KV_SCRUB": "off"}) == "off"


def _attr(var: envvars.EnvVar) -> str:
    return next(k for k, v in vars(envvars).items() if v is var)
