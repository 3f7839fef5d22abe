"""The coordinator's store: a totally ordered event log, member leases, and nothing else.

A store knows no protocol rule. Its one write to the log, `append`, adds a batch of events
(one row) at the next position and hands the caller every event before it that the caller
has not seen, with no gap, so that the caller's replica can replay them and then its own
batch: the log is one total order that every replica replays alike, and decisions are made
at replay, never under a lock. Around it: reading the log (a waiter's catch-up), leases with
heartbeats, and the claim a recoverer takes on a dead member's work.
`atomix.coordinator.sqlite_store` and `atomix.coordinator.postgres` are the two
implementations.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from atomix.errors import AtomixError

#: Member statuses. live: holds its lease; fenced: its lease expired (or it was taken over):
#: its appends are refused; recovered: a survivor settled its transactions; left: closed.
LIVE = "live"
FENCED = "fenced"
RECOVERED = "recovered"
LEFT = "left"


class CoordinatorError(AtomixError):
    """The coordinator cannot be reached or used (bad URL, missing driver, broken replica)."""


class Fenced(CoordinatorError):
    """This process lost its lease (it stalled or was presumed dead and taken over): the
    coordinator refuses its writes, so it cannot act on transactions a survivor has settled.
    Close the runtime and start again."""


class Event(NamedTuple):
    """One row of the log: its position, the member that appended it, and its batch of
    event bodies (empty: a hole, a position whose appender never committed it)."""

    seq: int
    member: int
    body: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Member:
    """One process's lease row, as a recoverer sees it."""

    id: int
    status: str
    log_dir: str | None
    pid: int
    host: str


class Store(Protocol):
    """A coordinator store (see the module docstring). Thread-safe."""

    url: str

    def register(self, *, pid: int, host: str, log_dir: str | None, options: str) -> int:
        """A new member's lease; checks the runtime options agree with the first member's."""
        ...

    def append(
        self, member: int, since: int, batch: Sequence[dict[str, Any]], *, notify: bool = False
    ) -> list[Event]:
        """Append `batch` as one row at the next position, unless `member` is no longer live
        (`Fenced`); return the events after `since` up to and including that row, in order
        and without a gap (the last is the caller's). `notify`: wake the listeners."""
        ...

    def read(self, since: int) -> list[Event]:
        """The events after `since`, in order and without a gap."""
        ...

    def heartbeat(self, member: int) -> bool:
        """Renew the lease; False once the member is no longer live (fenced). Never waits
        for the appends' lock: a busy coordinator must not starve its members' leases."""
        ...

    def fence_expired(self, lease: float, alive: Callable[[Member], bool] | None = None) -> list[int]:
        """Fence every live member whose heartbeat is older than `lease` seconds, unless
        `alive` (asked only about those) says it still lives; only a member still late when it
        is fenced is fenced."""
        ...

    def claim(self, recoverer: int) -> Member | None:
        """Take one fenced member's recovery, so no other recoverer does it at once (None:
        nothing to claim). Held until `release`."""
        ...

    def release(self, member: int, *, recovered: bool) -> None:
        """End a claim: the member is recovered, or left fenced for a later recoverer."""
        ...

    def fence(self, member: int) -> None:
        """Fence one member now (a restarted process fencing its dead predecessor)."""
        ...

    def members(self) -> list[Member]: ...

    def leave(self, member: int) -> None:
        """A clean close: the member's lease ends (it has no transaction left)."""
        ...

    def wait_for_news(self, since: int, timeout: float) -> bool:
        """Block until the log may have grown past `since` (or `timeout`): True if woken."""
        ...

    def quiet(self) -> None:
        """No transaction of this process waits any more: stop watching for news."""
        ...

    def close(self) -> None: ...


def dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


def dumps_batch(batch: Sequence[dict[str, Any]]) -> str:
    return json.dumps(list(batch), separators=(",", ":"), sort_keys=True)


def loads(text: str | bytes) -> list[dict[str, Any]]:
    """A row's batch (a single body, as older coordinators wrote, is a batch of one)."""
    body = json.loads(text)
    return body if isinstance(body, list) else [body]


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return url
