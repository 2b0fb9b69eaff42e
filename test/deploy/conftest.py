"""Kubernetes manifest tests (marker `deploy`): need kubectl and requirements/deploy.txt."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "deploy: renders and checks the Kubernetes manifests in deploy/")
