"""Shared by the tests of the benchmark scripts: load a script from ``benchmark/`` as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmark"


def load_benchmark(name: str, module_name: str | None = None) -> ModuleType:
    """``benchmark/<name>.py`` as the module ``module_name`` (default ``name``).

    Run as scripts they find their siblings (``bench_serving``) beside them; here their folder goes on the path the
    same way. The module is registered under its name before it runs (dataclasses resolve their module by name).
    """
    if str(BENCHMARK) not in sys.path:
        sys.path.insert(0, str(BENCHMARK))
    spec = importlib.util.spec_from_file_location(module_name or name, BENCHMARK / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
