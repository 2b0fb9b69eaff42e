"""A fake KV allocator for the cache tests."""

from __future__ import annotations


class FakePool:
    """Stand-in KV allocator: hands out fresh slot ids and checks each is freed at most once."""

    def __init__(self) -> None:
        self._next = 0
        self.live: set[int] = set()
        """Slots allocated and not yet freed."""
        self.freed: list[int] = []
        """Every slot freed, in order."""

    def alloc(self, n: int) -> list[int]:
        out = list(range(self._next, self._next + n))
        self._next += n
        self.live.update(out)
        return out

    def free(self, slots: list[int]) -> None:
        for slot in slots:
            assert slot in self.live, f"double free or foreign slot: {slot=}"
            self.live.remove(slot)
            self.freed.append(slot)
