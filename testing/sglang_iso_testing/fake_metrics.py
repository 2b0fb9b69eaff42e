"""A recorder standing in for sglang-iso's Prometheus series (``observability.metrics()``) in process tests."""

from __future__ import annotations

from collections import defaultdict

Key = tuple[str, tuple[tuple[str, str], ...]]
"""A series and its labels: ``(name, ((label, value), ...))``, labels sorted."""


class RecordedMetrics(dict):  # type: ignore[type-arg]
    """``observability.metrics()``'s shape: any series name gives a series whose ``labels(...)`` ``set``/``inc``
    calls are recorded in :attr:`calls`, by series and labels, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: defaultdict[Key, list[tuple[str, float]]] = defaultdict(list)

    def __missing__(self, name: str) -> _Series:
        return _Series(name, self.calls)


class _Series:
    def __init__(self, name: str, calls: defaultdict[Key, list[tuple[str, float]]]) -> None:
        self.name, self.calls = name, calls

    def labels(self, **labels: str) -> _Bound:
        return _Bound(self.calls[(self.name, tuple(sorted(labels.items())))])

    def inc(self, value: float = 1) -> None:
        self.calls[(self.name, ())].append(("inc", value))


class _Bound:
    def __init__(self, record: list[tuple[str, float]]) -> None:
        self.record = record

    def set(self, value: float) -> None:
        self.record.append(("set", value))

    def inc(self, value: float = 1) -> None:
        self.record.append(("inc", value))
