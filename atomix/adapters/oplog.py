"""The operation log: one record per real mutation a store performs, written below every mechanism.

The oracle trusts this log (design notes §5) because it is written by the stores themselves, after
the substrate has accepted the mutation and while the store still holds its own lock, so that the
order of ops on one scope is the order in which the substrate applied them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

#: Kinds the stores in this package emit. Kept open (a plain str) so that other adapters can add
#: their own, but these are the ones the oracle knows.
KINDS = frozenset({"write", "delete", "append", "upsert", "read", "dedup"})


@dataclass(frozen=True)
class Op:
    """One operation a store performed (or, for kind ``"dedup"``, suppressed) on one scope.

    ``seq`` is unique and strictly increasing within one log; ``meta`` is the caller's own
    description of the operation (transaction, epoch, op id ...), copied at append time.
    """

    seq: int
    substrate: str
    scope: str
    kind: str
    key: str | None
    # A dict is unhashable: leave it out of the hash (equal ops still hash equal).
    meta: dict[str, Any] = field(hash=False)

    def to_json(self) -> str:
        """One JSON Lines record. Unserialisable meta values are written as their ``str``."""
        record = {
            "seq": self.seq,
            "substrate": self.substrate,
            "scope": self.scope,
            "kind": self.kind,
            "key": self.key,
            "meta": self.meta,
        }
        # default=str: the mutation has already happened when we log it, so logging must not fail
        # on a meta value that JSON cannot represent.
        return json.dumps(record, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, line: str) -> Op:
        """Parse one record written by `to_json`."""
        r = json.loads(line)
        return cls(
            seq=int(r["seq"]),
            substrate=str(r["substrate"]),
            scope=str(r["scope"]),
            kind=str(r["kind"]),
            key=r["key"],
            meta=dict(r["meta"]),
        )


class OpLog:
    """A thread-safe, append-only list of `Op`, optionally persisted as JSON Lines.

    Guarantees: ``seq`` numbers are allocated and written under one lock, so the in-memory order,
    the file order and the ``seq`` order are the same. With ``path``, every op is flushed to the
    operating system before `append` returns (``fsync=True`` also forces it to the disk). Opening an
    existing file loads its ops and continues the numbering after them.
    """

    def __init__(self, path: Path | str | None = None, *, fsync: bool = False) -> None:
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._path = Path(path) if path is not None else None
        self._fsync = fsync
        self._fh: IO[str] | None = None
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            if self._path.exists():
                self._ops = self.load(self._path)
                truncate_torn_tail(self._path)
            self._fh = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 - kept open on purpose

    @property
    def path(self) -> Path | None:
        """The JSON Lines file this log persists to, if any."""
        return self._path

    def append(
        self,
        substrate: str,
        scope: str,
        kind: str,
        *,
        key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Op:
        """Record one op and return it (with its ``seq``)."""
        with self._lock:
            op = Op(
                seq=self._ops[-1].seq + 1 if self._ops else 1,
                substrate=substrate,
                scope=scope,
                kind=kind,
                key=key,
                meta=dict(meta) if meta else {},
            )
            if self._fh is not None:
                self._fh.write(op.to_json() + "\n")
                self._fh.flush()
                if self._fsync:
                    os.fsync(self._fh.fileno())
            self._ops.append(op)
            return op

    def ops(self) -> list[Op]:
        """A copy of every op so far, in ``seq`` order."""
        with self._lock:
            return list(self._ops)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops())

    def close(self) -> None:
        """Close the backing file (appending afterwards raises ``ValueError``)."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()

    def __enter__(self) -> OpLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def load(path: Path | str) -> list[Op]:
        """Read the ops persisted in ``path`` (the file, not any in-memory copy).

        A final line without its newline is a write torn by a crash: it is ignored.
        """
        text = Path(path).read_text(encoding="utf-8")
        lines = text.split("\n")
        # After the last "\n" comes either "" (clean end) or a torn fragment: drop it either way.
        return [Op.from_json(line) for line in lines[:-1] if line.strip()]


def truncate_torn_tail(path: Path) -> None:
    """Cut a final record that lacks its newline (a write torn by a crash) off an append-only file.

    Such a record was never acknowledged (its writer had not returned), and leaving it in place
    would glue the next record onto it.
    """
    with open(path, "rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)
            fh.flush()
            os.fsync(fh.fileno())


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (a created, renamed or removed file) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
