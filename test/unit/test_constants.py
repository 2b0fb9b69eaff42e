"""Each shared constant and name rule is defined once: in ``sglang_iso.constants`` or ``sglang_iso.names``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "python" / "sglang_iso", ROOT / "python" / "sglang_iso_testing", ROOT / "sgl-kernel-patches")
HOMES = {ROOT / "python" / "sglang_iso" / "constants.py", ROOT / "python" / "sglang_iso" / "names.py"}
DEFINED = re.compile(
    r"^\s*(MIN_SECRET_BYTES|CachePolicy|Policy|POLICIES|CACHE_POLICIES|BACKEND_NAME|TENANT_BACKEND|"
    r"SHARED_NAMESPACE_PREFIX|\w*NAME_PATTERN|TENANT_ID_PATTERN)[ \t]*(:[^=\n]+)?=(?![ \t]*[A-Za-z_]\w*[ \t]*$)",
    re.MULTILINE,
)


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted(pkg.rglob("*.py")) if p not in HOMES]


def test_no_module_redefines_a_shared_constant() -> None:
    # An alias to the home's value (``X = Y``) is allowed; a second literal definition is not.
    assert DEFINED.search('MIN_SECRET_BYTES = 32\nSHARED_NAME_PATTERN = re.compile("x")\n')  # positive control
    assert not DEFINED.search("GROUP_NAME_PATTERN = TENANT_ID_PATTERN\n")
    offenders = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in _sources() for m in DEFINED.finditer(p.read_text())]
    assert offenders == []


def test_the_shared_namespace_prefix_is_spelled_once() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in _sources() if '"shared:"' in p.read_text()]
    assert offenders == []


def test_homes_define_them() -> None:
    from sglang_iso import constants, names

    assert constants.MIN_SECRET_BYTES == 32 and constants.BACKEND_NAME == "tenant"
    assert constants.CACHE_POLICIES == ("private", "off") and constants.SHARED_NAMESPACE_PREFIX == "shared:"
    assert names.GROUP_NAME_PATTERN is names.TENANT_ID_PATTERN
