"""Suite-wide setup: CPU shims before any SGLang import, and the GPU marker."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

# NOTE: Triton reads TRITON_INTERPRET when kernels are decorated, and SGLang (imported by many test modules at
# collection) brings Triton in early: set it before anything else so the kernel tests run interpreted on CPU.
# Servers started by the tests do not inherit it (ServerProcess drops it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sglang_iso import settings
from sglang_iso.platform import bootstrap

bootstrap.apply()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if bootstrap.cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """Each test reads the process settings from its own environment (``sglang_iso.settings`` keeps them)."""
    settings.reset()
    yield
    settings.reset()
