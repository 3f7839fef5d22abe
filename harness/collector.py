"""The cyclic garbage collector paused for a block (`collector_paused`).

For code that allocates many short-lived, acyclic containers at once (parsing or copying a
DB, parsing a run's records, building a frame): every burst of allocations would set off
collections that walk every object alive, often at more cost than the work itself. Nothing
such a block builds needs the collector to be freed (reference counting frees it), so the
collector has nothing to find meanwhile; cyclic garbage made in the block waits until it is
back on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block, and back as it was after (still off if
    it was off before, so blocks nest)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
