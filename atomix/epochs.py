"""The epoch allocator: one totally ordered, monotone logical timestamp line."""

from __future__ import annotations


class EpochAllocator:
    """Hands out strictly increasing epochs.

    An epoch encodes order, not identity: a retried transaction gets a fresh, larger epoch.
    """

    __slots__ = ("_next",)

    def __init__(self, start: int = 1) -> None:
        self._next = start

    def allocate(self) -> int:
        epoch = self._next
        self._next += 1
        return epoch

    @property
    def next(self) -> int:
        """The epoch the next `allocate` will return."""
        return self._next
