"""Fixtures for the pure-logic cache tests: a fake KV pool and a tree wired to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_pool import FakePool

from sglang_iso.cache import TenantRadixTree


@pytest.fixture
def pool() -> FakePool:
    return FakePool()


@pytest.fixture(params=[1, 4], ids=["page1", "page4"])
def page_size(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def tree(pool: FakePool, page_size: int) -> Iterator[TenantRadixTree]:
    t = TenantRadixTree(page_size, pool.free)
    yield t
    t.check_integrity()
