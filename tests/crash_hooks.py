"""In-process crashes at a durable log's record points, shared by the log tests.

`crash_at(point)` makes the log's crash hook raise `Crash` when the log reaches `point`;
`reset_crash_hook` (an autouse fixture where it is imported) clears the hook after each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import atomix.log as atomix_log


class Crash(BaseException):
    """Stands in for a crash in-process: raised by the crash hook, it unwinds past every
    `except Exception`, and the test then abandons the runtime without closing anything
    but the log's lock (as a dead process's lock is released)."""


@pytest.fixture(autouse=True)
def reset_crash_hook() -> Iterator[None]:
    yield
    atomix_log.crash_hook = None


def crash_at(point: str) -> None:
    def hook(at: str, detail: str) -> None:
        if at == point:
            raise Crash(point)

    atomix_log.crash_hook = hook
