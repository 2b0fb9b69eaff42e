"""Suite-wide setup: CPU shims before any SGLang import, and the GPU marker."""

from __future__ import annotations

import pytest

from sglang_iso.platform import bootstrap

bootstrap.apply()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if bootstrap.cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
