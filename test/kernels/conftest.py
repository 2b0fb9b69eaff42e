"""Kernel tests: make ``sgl-kernel-patches`` importable and run Triton in its interpreter on CPU.

NOTE: ``TRITON_INTERPRET`` must be set before ``@triton.jit`` decorates the kernels (at import of the
``sglang_iso_kernels._*_triton`` modules), so it is set here at conftest import. It is process-wide: set only
when there is no CUDA, so a GPU machine compiles the kernels for real.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

_PATCHES = Path(__file__).resolve().parents[2] / "sgl-kernel-patches"
if str(_PATCHES) not in sys.path:
    sys.path.insert(0, str(_PATCHES))

from sglang_iso_kernels._backend import triton_interpreting  # noqa: E402

TRITON_RUNNABLE = importlib.util.find_spec("triton") is not None and (CUDA or triton_interpreting())
SEEDS = (0, 1, 2)


@pytest.fixture
def device() -> torch.device:
    """Where test tensors live: CUDA when present (compiled Triton), else CPU (interpreted Triton)."""
    return torch.device("cuda" if CUDA else "cpu")


@pytest.fixture(params=["torch", "triton"])
def use_triton(request: pytest.FixtureRequest) -> bool:
    """Run each test against both implementations; the Triton one is skipped where it cannot run."""
    if request.param == "triton" and not TRITON_RUNNABLE:
        pytest.skip("Triton cannot run here (no CUDA and TRITON_INTERPRET unset)")
    return request.param == "triton"
