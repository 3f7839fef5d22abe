"""The aliasing workload's substrates, each telling which real resource a call touched.

Ground truth for paper Table 20 must come from the substrate, not from the scope rules
under test, so every call records what the substrate itself resolved:

- files: the operating system resolves the path as spelt (`..`, `.`, `//`, symlinks, letter
  case on this case-sensitive file system); the identity is the (device, inode) `fstat`
  reports for the file descriptor the kernel opened. Writes are in place, so a file keeps
  its inode.
- SQLite: a real database file opened by the path as spelt; the database is the inode the
  path leads to, a written row is what the table's own AFTER UPDATE trigger records in an
  audit table (table and rowid), a read row is the rowid SQLite returns and the table name
  its authorizer reports (SQLite resolves identifier case itself).
- URLs: an in-process web API whose router decides which stored resource a URL names, as
  common HTTP servers route: scheme and host are case-insensitive (RFC 3986 section 6.2.2.1),
  a default port is the same origin, escapes are decoded, dot segments removed (section
  5.2.4), a trailing slash ignored (non-strict routing), query parameters parsed into
  name-sorted pairs; paths are case-sensitive. This router is written independently of
  atomix.scopes, but it follows the same RFC, so agreement with url_scope is expected.
- mail: the project's append-only mailbox sink; the mailbox a message reached is the
  recipient the sink's own file records (the sink folds addresses as atomix.scopes does, so
  for mail the ground truth and the canonical rule share one definition).

Identities (inode numbers, paths) never enter a trial record: only the booleans derived
from comparing them do, so records stay reproducible.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from atomix.adapters import OpLog

Identity = tuple[Any, ...]
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Touch:
    """One resource one agent attempt read or wrote, as the substrate identified it."""

    agent: str
    attempt: int
    kind: str  # "read" or "write"
    identity: Identity


@dataclass
class TouchLog:
    """Every touch of a trial, in the order the substrates performed them."""

    touches: list[Touch] = field(default_factory=list)

    def add(self, meta: Mapping[str, Any], kind: str, identities: Iterable[Identity]) -> None:
        agent, attempt = str(meta.get("agent", "?")), int(meta.get("attempt", 0))
        for identity in identities:
            self.touches.append(Touch(agent, attempt, kind, identity))


def _log(oplog: OpLog, substrate: str, scope: str, kind: str, meta: Mapping[str, Any]) -> None:
    oplog.append(substrate, scope, kind, meta=meta)


# --------------------------------------------------------------------------- files


class OsFiles:
    """Real files under `root`, opened by the path as the caller spelt it (the kernel
    resolves it); each call records the (device, inode) of what it opened."""

    def __init__(self, root: Path, touches: TouchLog, oplog: OpLog) -> None:
        self.root = Path(os.path.realpath(root))
        self._touches = touches
        self._oplog = oplog

    def full(self, path: str) -> str:
        """The path as a shim would hand it on: joined onto the root, not normalised."""
        return os.path.join(self.root, path)

    def _write_one(self, full: str, data: bytes, meta: Mapping[str, Any]) -> Identity:
        # "r+b" then truncate: the file is rewritten in place, so it keeps its inode.
        with open(full, "r+b") as fh:
            fh.truncate(0)
            fh.write(data)
            st = os.fstat(fh.fileno())
        _log(self._oplog, "fs", "fs:" + os.path.realpath(full), "write", meta)
        return ("file", st.st_dev, st.st_ino)

    def write(self, path: str, text: str, meta: Mapping[str, Any]) -> None:
        identity = self._write_one(self.full(path), text.encode(), meta)
        self._touches.add(meta, "write", [identity])

    def read(self, path: str, meta: Mapping[str, Any]) -> str:
        full = self.full(path)
        with open(full, "rb") as fh:
            data = fh.read()
            st = os.fstat(fh.fileno())
        _log(self._oplog, "fs", "fs:" + os.path.realpath(full), "read", {**meta, "read": True})
        self._touches.add(meta, "read", [("file", st.st_dev, st.st_ino)])
        return data.decode()

    def files_below(self, directory: str) -> list[str]:
        """Every regular file below `directory` (as spelt), in a fixed order."""
        out: list[str] = []
        for here, dirs, names in os.walk(self.full(directory)):
            dirs.sort()
            for name in sorted(names):
                full = os.path.join(here, name)
                if os.path.isfile(full) and not os.path.islink(full):
                    out.append(full)
        return out

    def write_tree(self, directory: str, text: str, meta: Mapping[str, Any]) -> None:
        identities = [self._write_one(f, text.encode(), meta) for f in self.files_below(directory)]
        self._touches.add(meta, "write", identities)

    def image(self, paths: Iterable[str]) -> dict[str, bytes]:
        """Before-image of files (full paths) for an undo."""
        return {p: Path(p).read_bytes() for p in paths}

    def restore(self, image: Mapping[str, bytes], meta: Mapping[str, Any]) -> None:
        for full, data in image.items():
            self._write_one(full, data, meta)


# --------------------------------------------------------------------------- SQLite

_AUDIT = "_audit"


class AuditedSQLite:
    """Real SQLite database files in `directory`; every user table has an AFTER UPDATE
    trigger that records (table, rowid) in the database's own audit table."""

    def __init__(self, directory: Path, touches: TouchLog, oplog: OpLog) -> None:
        self.directory = Path(os.path.realpath(directory))
        self._touches = touches
        self._oplog = oplog

    def full(self, db: str) -> str:
        return os.path.join(self.directory, db)

    def create(self, db: str, tables: Mapping[str, tuple[str, Iterable[Any]]]) -> None:
        """Make database `db` with `tables`: name -> (key column type, keys)."""
        with sqlite3.connect(self.full(db), isolation_level=None) as conn:
            conn.execute(f"CREATE TABLE {_AUDIT} (seq INTEGER PRIMARY KEY, tbl TEXT, rid INTEGER)")
            for name, (key_type, keys) in tables.items():
                if key_type == "INTEGER":
                    conn.execute(f'CREATE TABLE "{name}" (id INTEGER PRIMARY KEY, note TEXT)')
                else:
                    conn.execute(f'CREATE TABLE "{name}" (name TEXT PRIMARY KEY, note TEXT)')
                conn.execute(
                    f'CREATE TRIGGER "{_AUDIT}_{name}" AFTER UPDATE ON "{name}" BEGIN '
                    f"INSERT INTO {_AUDIT} (tbl, rid) VALUES ('{name}', NEW.rowid); END"
                )
                conn.executemany(f'INSERT INTO "{name}" VALUES (?, ?)', [(k, "") for k in keys])
        conn.close()

    def _db_identity(self, db: str) -> tuple[int, int]:
        st = os.stat(self.full(db))  # follows symlinks, as opening the file did
        return st.st_dev, st.st_ino

    def _connect(self, db: str) -> sqlite3.Connection:
        full = self.full(db)
        if not os.path.exists(full):
            raise FileNotFoundError(f"no database {full}")  # connect() would create one
        return sqlite3.connect(full, isolation_level=None)

    @staticmethod
    def _key_column(conn: sqlite3.Connection, table: str, by: str) -> str:
        if by == "rowid":
            return "rowid"
        for _cid, name, _type, _notnull, _default, pk in conn.execute(f'PRAGMA table_info("{table}")'):
            if pk:
                return str(name)
        raise ValueError(f"table {table!r} has no primary key")

    def _user_tables(self, conn: sqlite3.Connection) -> list[str]:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        return [r[0] for r in rows if r[0] != _AUDIT and not r[0].startswith("sqlite_")]

    def _update(self, db: str, statements: list[tuple[str, tuple[Any, ...]]], meta: Mapping[str, Any]) -> None:
        dev, ino = self._db_identity(db)
        conn = self._connect(db)
        try:
            conn.execute("BEGIN IMMEDIATE")
            mark = conn.execute(f"SELECT coalesce(max(seq), 0) FROM {_AUDIT}").fetchone()[0]
            for sql, args in statements:
                conn.execute(sql, args)
            rows = conn.execute(f"SELECT tbl, rid FROM {_AUDIT} WHERE seq > ? ORDER BY seq", (mark,)).fetchall()
            conn.execute("COMMIT")
        finally:
            conn.close()
        for tbl, rid in rows:
            _log(self._oplog, "sqlite", f"sqlite:{ino}:{tbl}:{rid}", "upsert", meta)
        self._touches.add(meta, "write", [("row", dev, ino, tbl, rid) for tbl, rid in rows])

    def update_row(self, db: str, table: str, key: Any, note: str, by: str, meta: Mapping[str, Any]) -> None:
        conn = self._connect(db)
        try:
            column = self._key_column(conn, table, by)
        finally:
            conn.close()
        self._update(db, [(f'UPDATE "{table}" SET note = ? WHERE {column} = ?', (note, key))], meta)

    def update_table(self, db: str, table: str, note: str, meta: Mapping[str, Any]) -> None:
        self._update(db, [(f'UPDATE "{table}" SET note = ?', (note,))], meta)

    def update_database(self, db: str, note: str, meta: Mapping[str, Any]) -> None:
        conn = self._connect(db)
        try:
            tables = self._user_tables(conn)
        finally:
            conn.close()
        self._update(db, [(f'UPDATE "{t}" SET note = ?', (note,)) for t in tables], meta)

    def read_row(self, db: str, table: str, key: Any, by: str, meta: Mapping[str, Any]) -> str | None:
        dev, ino = self._db_identity(db)
        conn = self._connect(db)
        read_tables: set[str] = set()

        def authorizer(action: int, arg1: str | None, *_: Any) -> int:
            if action == sqlite3.SQLITE_READ and arg1 is not None:
                read_tables.add(arg1)  # the table's stored name, as SQLite resolved it
            return sqlite3.SQLITE_OK

        try:
            column = self._key_column(conn, table, by)
            conn.set_authorizer(authorizer)
            row = conn.execute(f'SELECT rowid, note FROM "{table}" WHERE {column} = ?', (key,)).fetchone()
        finally:
            conn.close()
        if row is None:
            return None
        (real,) = read_tables
        _log(self._oplog, "sqlite", f"sqlite:{ino}:{real}:{row[0]}", "read", {**meta, "read": True})
        self._touches.add(meta, "read", [("row", dev, ino, real, row[0])])
        return str(row[1])

    def notes(self, db: str, table: str | None = None) -> dict[tuple[str, int], str]:
        """(table, rowid) -> note, for a before-image."""
        conn = self._connect(db)
        try:
            tables = [table] if table is not None else self._user_tables(conn)
            out: dict[tuple[str, int], str] = {}
            for t in tables:
                for rid, note in conn.execute(f'SELECT rowid, note FROM "{t}"'):
                    out[(t, rid)] = note
            return out
        finally:
            conn.close()

    def restore(self, db: str, image: Mapping[tuple[str, int], str], meta: Mapping[str, Any]) -> None:
        self._update(
            db, [(f'UPDATE "{t}" SET note = ? WHERE rowid = ?', (note, rid)) for (t, rid), note in image.items()], meta
        )


# --------------------------------------------------------------------------- web


def route(url: str) -> Identity:
    """The resource a URL names on this web API (see the module docstring)."""
    split = urlsplit(url.strip())
    scheme = split.scheme.lower()
    host = split.hostname  # lower-cased by urlsplit
    if scheme not in _DEFAULT_PORTS or not host:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = split.port if split.port is not None else _DEFAULT_PORTS[scheme]
    segments: list[str] = []
    for raw in split.path.split("/"):
        seg = unquote(raw)
        if seg in ("", "."):
            continue
        if seg == "..":
            if segments:
                segments.pop()
            continue
        segments.append(seg)
    query = sorted(parse_qsl(split.query, keep_blank_values=True), key=lambda kv: kv[0])
    return ("web", scheme, host, port, tuple(segments), tuple(query))


def _text(identity: Identity) -> str:
    _, scheme, host, port, segments, query = identity
    q = "&".join(f"{k}={v}" for k, v in query)
    return f"web:{scheme}://{host}:{port}/{'/'.join(segments)}" + (f"?{q}" if q else "")


class WebStore:
    """An in-process web API: a store of resources, each named by `route` of its URL."""

    def __init__(self, touches: TouchLog, oplog: OpLog) -> None:
        self.resources: dict[Identity, str] = {}
        self._touches = touches
        self._oplog = oplog

    def seed(self, urls: Iterable[str]) -> None:
        for url in urls:
            self.resources[route(url)] = ""

    def get(self, url: str, meta: Mapping[str, Any]) -> str | None:
        identity = route(url)
        _log(self._oplog, "web", _text(identity), "read", {**meta, "read": True})
        self._touches.add(meta, "read", [identity])
        return self.resources.get(identity)

    def put(self, url: str, body: str, meta: Mapping[str, Any]) -> None:
        identity = route(url)
        self.resources[identity] = body
        _log(self._oplog, "web", _text(identity), "write", meta)
        self._touches.add(meta, "write", [identity])

    def below(self, url: str) -> list[Identity]:
        """The collection a URL names and every stored resource below it (same origin)."""
        top = route(url)
        n = len(top[4])
        found = [i for i in self.resources if i[:4] == top[:4] and i[4][:n] == top[4]]
        return sorted(set(found) | {top})

    def put_collection(self, url: str, body: str, meta: Mapping[str, Any]) -> None:
        identities = self.below(url)
        for identity in identities:
            self.resources[identity] = body
            _log(self._oplog, "web", _text(identity), "write", meta)
        self._touches.add(meta, "write", identities)

    def restore(self, image: Mapping[Identity, str | None], meta: Mapping[str, Any]) -> None:
        for identity, body in image.items():
            if body is None:
                self.resources.pop(identity, None)
            else:
                self.resources[identity] = body
            _log(self._oplog, "web", _text(identity), "write", meta)

    def snapshot(self) -> dict[str, str]:
        return {_text(i): v for i, v in sorted(self.resources.items())}
