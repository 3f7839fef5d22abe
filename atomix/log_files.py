"""The durable log's files: its SQLite database (`open_database`), the directory lock and the
sidecar.

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
import secrets
import sqlite3
from pathlib import Path
from typing import IO, Any

from atomix.errors import AtomixError
from atomix.log_format import FORMAT, VERSION

try:
    import fcntl

    _CAN_LOCK = True
except ImportError:  # pragma: no cover - not POSIX: no cross-process lock
    _CAN_LOCK = False

LOG_FILE = "atomix-log.sqlite3"
LOCK_FILE = "atomix-log.lock"
#: The sidecar that names the log and says whether its last writer closed it (see `LogLost`).
ID_FILE = "atomix-log.id"

#: The log's tables (`atomix.coordinator.db_log` keeps the same columns in PostgreSQL).
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    n INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT UNIQUE NOT NULL,
    pid INTEGER NOT NULL, started REAL NOT NULL);
CREATE TABLE IF NOT EXISTS txs (
    run_id TEXT NOT NULL, txid INTEGER NOT NULL, epoch INTEGER NOT NULL, trace TEXT NOT NULL,
    state TEXT NOT NULL, commit_seq INTEGER, updated REAL NOT NULL,
    PRIMARY KEY (run_id, txid));
CREATE TABLE IF NOT EXISTS effects (
    run_id TEXT NOT NULL, txid INTEGER NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL,
    tool TEXT NOT NULL, class TEXT NOT NULL, status TEXT NOT NULL,
    redo TEXT NOT NULL, problem TEXT,
    PRIMARY KEY (run_id, txid, key));
CREATE TABLE IF NOT EXISTS deliveries (
    run_id TEXT NOT NULL, txid INTEGER NOT NULL, key TEXT NOT NULL,
    attempts INTEGER NOT NULL, last_error TEXT, next_at REAL,
    PRIMARY KEY (run_id, txid, key));
CREATE TABLE IF NOT EXISTS dead_letters (
    run_id TEXT NOT NULL, txid INTEGER NOT NULL, key TEXT NOT NULL, tool TEXT NOT NULL,
    class TEXT NOT NULL, redo TEXT NOT NULL, attempts INTEGER NOT NULL, last_error TEXT,
    died REAL NOT NULL, PRIMARY KEY (run_id, txid, key));
CREATE TABLE IF NOT EXISTS quarantine (
    n INTEGER PRIMARY KEY AUTOINCREMENT, what TEXT NOT NULL, ident TEXT NOT NULL,
    reason TEXT NOT NULL, record TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS stores (
    run_id TEXT NOT NULL, kind TEXT NOT NULL, path TEXT NOT NULL,
    PRIMARY KEY (run_id, kind, path));
CREATE TABLE IF NOT EXISTS finished_runs (run_id TEXT PRIMARY KEY, at REAL NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('format', '{FORMAT}'), ('version', '{VERSION}');
"""


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


def open_database(
    conn: sqlite3.Connection, directory: Path, journal: str, sidecar: dict[str, Any] | None,
    wal_missing: bool,
) -> str:
    """Check the database against the sidecar (`LogLost`), create its tables, and return
    the log's identity."""
    path = directory / LOG_FILE
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if tables and "meta" not in tables:
        raise LogError(path, "not an Atomix log (a SQLite database without its tables)")
    meta = dict(conn.execute("SELECT name, value FROM meta")) if tables else {}
    if sidecar is not None:
        known = str(sidecar["log"])
        if not tables and wal_missing:  # nothing was ever checkpointed: all was in the WAL
            raise LogLost(path.with_name(LOG_FILE + "-wal"), lost_wal(directory, sidecar))
        if not tables:
            raise LogLost(path, lost_body(directory, known))
        if meta.get("log_id") != known:
            raise LogLost(path, lost_body(directory, known, found=meta.get("log_id")))
        if wal_missing and meta.get("token") != sidecar.get("token"):
            raise LogLost(path.with_name(LOG_FILE + "-wal"), lost_wal(directory, sidecar))
    mode = conn.execute(f"PRAGMA journal_mode={journal}").fetchone()[0]
    if str(mode).lower() != journal:
        raise LogError(path, f"cannot use the {journal} journal (got {mode!r})")
    # Checkpoints are the log's own (see TxLog._rotate_token): SQLite's automatic ones would
    # copy the token into the body while later records are still only in the WAL.
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.executescript(SCHEMA)
    meta = dict(conn.execute("SELECT name, value FROM meta"))
    if meta.get("format") != FORMAT:
        raise LogError(path, f"not an Atomix log (format {meta.get('format')!r})")
    if meta.get("version") != str(VERSION):
        raise LogError(path, f"log version {meta.get('version')}, this Atomix reads {VERSION}")
    conn.execute("SELECT count(*) FROM effects").fetchone()  # fails on a damaged table
    log_id = meta.get("log_id")
    if log_id is None:  # a new log (or one written before logs had an identity)
        log_id = secrets.token_hex(8)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("INSERT INTO meta VALUES ('log_id', ?)", (log_id,))
    return str(log_id)
