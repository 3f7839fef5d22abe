"""The epoch allocator: one totally ordered, monotone logical timestamp line."""

from __future__ import annotations

import itertools


class EpochAllocator:
    """Hands out strictly increasing epochs.

    An epoch encodes order, not identity: a retried transaction gets a fresh, larger epoch.
    """

    __slots__ = ("_counter", "allocate")

    def __init__(self, start: int = 1) -> None:
        self._counter = itertools.count(start)
        # Every begin allocates one: a counter's own __next__ is a C call, not a Python frame.
        self.allocate = self._counter.__next__
        """Return the next epoch (each call a larger one)."""

    @property
    def next(self) -> int:
        """The epoch the next `allocate` will return."""
        return int(repr(self._counter)[len("count(") : -1])  # a count shows its next value
