"""The durable log's files beside its database: the directory lock and the sidecar.

``atomix-log.lock`` is held (flock) by the one process that has the log open. The sidecar
``atomix-log.id`` holds the log's identity (also in the database's ``meta``) and its current
token. The log writes a new token to the sidecar, then to the database, at every open and
after each of its own checkpoints (SQLite's automatic checkpoints are off). So the database
file holds the sidecar's token only if a checkpoint copied the whole WAL after the token was
written: a closing connection's, after which SQLite deletes the WAL. A missing WAL is
therefore harmless when the database holds the sidecar's token, and a lost WAL when it does
not. A database file that is missing, empty or of another identity is a lost body. Both are
refused (`LogLost`) instead of read as an empty or complete log.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from atomix.errors import AtomixError

try:
    import fcntl

    _CAN_LOCK = True
except ImportError:  # pragma: no cover - not POSIX: no cross-process lock
    _CAN_LOCK = False

LOG_FILE = "atomix-log.sqlite3"
LOCK_FILE = "atomix-log.lock"
#: The sidecar that names the log and says whether its last writer closed it (see `LogLost`).
ID_FILE = "atomix-log.id"


class LogError(AtomixError):
    """The log at `path` is missing, unreadable or not an Atomix log."""

    def __init__(self, path: Path | str, message: str) -> None:
        self.path = Path(path)
        super().__init__(f"{path}: {message}")


class LogBusy(LogError):
    """Another live process (or another open `TxLog` in this one) holds the log."""


class LogLost(LogError):
    """The log's body or its WAL is gone (or replaced) while its sidecar says it held records:
    reading it as empty would silently drop committed transactions, so it is refused."""


def _read_sidecar(directory: Path) -> dict[str, Any] | None:
    path = directory / ID_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LogError(path, f"cannot read the log's sidecar: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("log"), str):
        raise LogError(path, f"not an Atomix log sidecar (expected JSON with its 'log' identity, got {text[:60]!r})")
    return data


def check_sidecar(directory: Path) -> dict[str, Any] | None:
    """The sidecar's record (None if there is none); a missing body is a `LogLost`."""
    sidecar = _read_sidecar(directory)
    if sidecar is None:
        return None
    body = directory / LOG_FILE
    if not body.exists():
        raise LogLost(body, lost_body(directory, sidecar["log"]))
    return sidecar


def lost_wal(directory: Path, sidecar: dict[str, Any]) -> str:
    return (
        f"the WAL of log {sidecar['log']} is missing, and {LOG_FILE} does not hold the token "
        f"{ID_FILE} names (written after the last checkpoint): the records the WAL held "
        "(committed transactions among them) are lost, so the log is refused rather than read "
        f"as complete. Restore the WAL file if you can; to give the log up and start a new one, "
        f"move {directory} aside and settle its stores by hand"
    )


def lost_body(directory: Path, known: str, found: str | None = None) -> str:
    what = "is missing or empty" if found is None else f"holds another log ({found})"
    return (
        f"{LOG_FILE} {what}, but {ID_FILE} says log {known} was here: its records (committed "
        "transactions among them) are lost, so it is refused rather than read as empty. Restore "
        f"the file if you can; to give the log up and start a new one, move {directory} aside "
        "and settle its stores by hand"
    )


def write_sidecar(directory: Path, log_id: str, token: str, *, durable: bool) -> None:
    """Atomically replace the sidecar (a temporary file renamed over it)."""
    path = directory / ID_FILE
    tmp = directory / f".{ID_FILE}.{os.getpid()}.tmp"
    record = {"log": log_id, "token": token, "pid": os.getpid()}
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        if durable:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if durable:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def take_lock(path: Path) -> IO[str]:
    fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the log's lifetime
    if not _CAN_LOCK:  # pragma: no cover
        return fh
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise LogBusy(path.parent, f"the Atomix log is in use (held by {holder})") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()}")
    fh.flush()
    return fh
