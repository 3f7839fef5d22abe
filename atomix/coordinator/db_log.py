"""The durable log in the coordinator's PostgreSQL database: recovery by any survivor, any host.

``Runtime(coordinator="postgresql://...", log="coordinator")`` keeps the process's durable log
(intents, committed marks, settlements, keys, dead letters: `atomix.log.TxLog`) in the
coordinator's database instead of a directory. The coordinator records the log as the
member's ``log_dir`` in the form ``coordinator-log://NAME`` (`locator`), so a survivor on any
host, or ``atomix recover --coordinator URL``, opens it from the database alone and finishes
the dead process's committed transactions by key and compensates the rest
(`atomix.recovery.recover`, unchanged).

Layout: the schema ``atomix_log`` registers the logs by name (``atomix_log.logs``: number,
name); log number N is the schema ``atomix_log_N``, holding the SQLite log's tables with the
same columns, so `TxLog`'s statements (written in SQLite's spelling) run on it after a
mechanical translation (`to_postgres`: ``?`` placeholders, ``INSERT OR IGNORE/REPLACE``).
`CoordinatorLog` overrides only the storage methods of `TxLog`: the record points, the
readback, the retries and the housekeeping are the same code.

One process at a time, as with a directory's lock file: opening a log takes a session advisory
lock on it (``pg_try_advisory_lock(LOCK_CLASS, N)``) on the log's own connection; a second
opener gets `LogBusy`. The lock lives as long as the connection, which a process that dies
(however it dies) loses: at once on one host, within the TCP keepalive this connection sets
(`KEEPALIVE`) for a vanished host. A held lock proves its member alive, so a late heartbeat
does not get it fenced (`log_held_in`). The lock is not the only fence: a recoverer opens a
dead member's log only once the coordinator has fenced the member and the recoverer claimed it
(`atomix.coordinator.members`). The log never reconnects: once its connection is lost, a
write fails (warned about, as a disk error is), because another process may have taken the
log over.

Durability: a record is durable once its PostgreSQL transaction commits with
``synchronous_commit`` on. The committed mark and a reversible call's start (the records whose
loss could lose or strand an effect) commit so; the others commit with it off (``durable=False``:
all of them) and ride on the next synchronous commit, which flushes the server's WAL up to it,
in order: the SQLite log's rule (``synchronous=NORMAL`` + FULL at the commit point). A killed
client loses nothing it committed; only a crash of the server can lose asynchronous commits.
The SQLite log's sidecar and token (a lost WAL file) have no counterpart: the server's own
recovery keeps its WAL whole.

Clean-up: every process makes a log of its own, so a log goes (its schema and its row in
``atomix_log.logs``, in one transaction committed synchronously, under the registry's lock)
once it is finished: closing a `CoordinatorLog` drops it when it holds no unfinished work (no
row in ``txs``, ``effects``, ``deliveries``, ``dead_letters`` or ``quarantine``: dead letters
and quarantined records wait for a human, and ``atomix recover --status --coordinator URL``
lists them) and no store keys of another run wait to be pruned. That covers the process's
own clean close (`Runtime.close`) and a recoverer's clean recovery of a dead member's log
(it opens, recovers and closes the log). Only the holder of the log's lock drops it, so a
live process's log is never dropped. A log that could not be dropped (its connection was
lost, the process was killed) is swept by ``atomix recover --coordinator URL``
(`atomix.coordinator.db_log_admin.sweep_logs`): every log no live or fenced member names and
whose lock is free is recovered (built-in adapters' effects) and closed, so dropped if it is
then finished. ``atomix recover --status --coordinator URL`` reads every log without its lock
(`atomix.coordinator.db_log_admin.log_statuses`).

Key pruning (``stores`` and ``finished_runs``, `atomix.log_housekeeping`): the applied keys a
run left in the adapter stores are there for a redelivery from the log. At its own clean
close a process prunes its runs' keys at once, after the drop committed: the log, the only
source of a redelivery, is gone, and no effect of the process is in flight (close refuses
with a transaction open). A dead member's runs are another matter: the process may still be
applying (cut off from the database, not from the stores), so their keys are kept for
``key_retention`` as with a directory: the recovered log stays, holding only its ``stores``
rows, until a sweep finds the retention passed, prunes them and drops it. A prune that fails
is warned about and leaves the keys (harmless: a key only dedupes).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import socket
import threading
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atomix.coordinator.store import CoordinatorError, safe_url
from atomix.log import LogBusy, LogError, TxLog
from atomix.log_format import FORMAT, VERSION

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "LOCATOR",
    "CoordinatorLog",
    "NoSuchLog",
    "coordinator_log",
    "locator",
    "log_held_in",
    "log_name",
    "to_postgres",
]

#: How the coordinator's member table names a log kept in its database ("://" never occurs in
#: the text of a directory's path, so the two cannot be mistaken for each other).
LOCATOR = "coordinator-log://"
#: The first key of every log's advisory lock (the second is the log's number; 0 serialises
#: creating logs). The two-key form is a lock space apart from the coordinator's one-key lock.
LOCK_CLASS = 0x41544C47  # "ATLG"
#: Server-side TCP keepalive of a log's connection (seconds idle, between probes, probes):
#: how soon the server drops a vanished host's connection, and so its log's lock.
KEEPALIVE = (10, 5, 3)
#: What `Runtime(log=...)` says to keep the log in the coordinator's database.
IN_COORDINATOR = "coordinator"

# The SQLite log's tables (atomix.log), in PostgreSQL's types: the same columns in the same
# order (rows are inserted by position), and a trailing `rowid` where the readback names one.
_TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "meta": ("name text, value text NOT NULL", ("name",)),
    "runs": ("n integer, run_id text UNIQUE NOT NULL, pid integer NOT NULL, "
             "started double precision NOT NULL", ("n",)),
    "txs": ("run_id text NOT NULL, txid bigint NOT NULL, epoch bigint NOT NULL, trace text NOT NULL, "
            "state text NOT NULL, commit_seq bigint, updated double precision NOT NULL, "
            "rowid bigserial", ("run_id", "txid")),
    "effects": ("run_id text NOT NULL, txid bigint NOT NULL, key text NOT NULL, seq bigint NOT NULL, "
                "tool text NOT NULL, class text NOT NULL, status text NOT NULL, redo text NOT NULL, "
                "problem text, rowid bigserial", ("run_id", "txid", "key")),
    "deliveries": ("run_id text NOT NULL, txid bigint NOT NULL, key text NOT NULL, "
                   "attempts integer NOT NULL, last_error text, next_at double precision, "
                   "rowid bigserial", ("run_id", "txid", "key")),
    "dead_letters": ("run_id text NOT NULL, txid bigint NOT NULL, key text NOT NULL, tool text NOT NULL, "
                     "class text NOT NULL, redo text NOT NULL, attempts integer NOT NULL, last_error text, "
                     "died double precision NOT NULL", ("run_id", "txid", "key")),
    "quarantine": ("n bigserial, what text NOT NULL, ident text NOT NULL, reason text NOT NULL, "
                   "record text NOT NULL, at double precision NOT NULL", ("n",)),
    "stores": ("run_id text NOT NULL, kind text NOT NULL, path text NOT NULL", ("run_id", "kind", "path")),
    "finished_runs": ("run_id text, at double precision NOT NULL", ("run_id",)),
}

#: Why closing kept a log (`CoordinatorLog.kept`).
WORK, KEYS, LOST = "work", "keys", "lost"
#: The tables whose rows are work left in the log (for a program, a recoverer or a human).
_WORK_TABLES = ("txs", "effects", "deliveries", "dead_letters", "quarantine")

_INSERT_OR = re.compile(r"^INSERT OR (IGNORE|REPLACE) INTO (\w+)")


@functools.lru_cache(maxsize=256)
def to_postgres(sql: str) -> str:
    """A statement of `TxLog` (SQLite's spelling) in PostgreSQL's: ``%s`` placeholders, and
    ``INSERT OR IGNORE`` / ``INSERT OR REPLACE`` as ``ON CONFLICT`` on the table's key.
    Statements carry no literal ``?`` or ``%`` (the log's are all parameterised)."""
    found = _INSERT_OR.match(sql)
    out = sql.replace("?", "%s")
    if found is None:
        return out
    how, table = found.group(1), found.group(2)
    if table not in _TABLES:
        raise ValueError(f"to_postgres: no table {table!r} in the log")
    out = f"INSERT INTO {table}" + out[found.end():]
    if how == "IGNORE":
        return out + " ON CONFLICT DO NOTHING"
    columns, key = _TABLES[table]
    names = [part.split()[0] for part in columns.split(", ")]
    sets = ", ".join(f"{c} = excluded.{c}" for c in names if c not in key and c != "rowid")
    return out + f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets}"


def locator(name: str) -> str:
    """The text the coordinator records as the member's log, for the log named `name`."""
    return LOCATOR + name


def log_name(location: str | None) -> str | None:
    """The name of the log in the coordinator's database `location` names (None: a directory)."""
    if location is None or not location.startswith(LOCATOR):
        return None
    return location[len(LOCATOR):]


def default_name() -> str:
    """A new log's name: unique (a random part), and telling whose it was (host, pid)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= 200 or not name.isprintable():
        raise ValueError(f"a log's name must be 1 to 200 printable characters, not {name!r}")
    return name


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise CoordinatorError(
            "a log in a postgresql:// coordinator needs psycopg 3: pip install 'atomix-tx[coordinator]'"
        ) from exc
    return psycopg



class NoSuchLog(LogError):
    """No log of this name in the coordinator's database (never made, or finished and dropped)."""


class CoordinatorLog(TxLog):
    """A `TxLog` whose records live in the coordinator's PostgreSQL database (see the module
    docstring), opened for one process at a time by name.

    Guarantees: those of `TxLog` - the committed mark is durable (a synchronous commit) before
    the first effect of its transaction is applied or released, a reversible call's record
    before the call runs; one open `CoordinatorLog` per name at a time (`LogBusy`) - with a
    log any host reaching the database can open once its process is gone. `create=False`
    refuses a name the database does not hold (`LogError`); a database that cannot be
    reached or used is a `CoordinatorError` (never a `LogError`: a recoverer must not take
    it for a missing log)."""

    def __init__(
        self,
        url: str,
        name: str | None = None,
        *,
        durable: bool = True,
        create: bool = True,
        max_delivery_attempts: int = 5,
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 60.0,
        key_retention: float = 86400.0,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"CoordinatorLog: expected a 'postgresql://' URL, got {safe_url(url)!r}")
        self._configure(
            durable=durable, max_delivery_attempts=max_delivery_attempts, retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max, key_retention=key_retention,
        )
        self.url = url
        self.name = default_name() if name is None else _check_name(name)
        self.location = locator(self.name)
        pg = _psycopg()
        self._db_errors = (pg.Error,)
        self._lock = threading.Lock()
        try:
            conn = pg.connect(url, autocommit=True)
        except pg.Error as exc:
            raise CoordinatorError(f"log {self.location}: cannot reach {safe_url(url)}: {exc}") from exc
        try:
            self.number = self._take(conn, create=create)
            idle, interval, count = KEEPALIVE
            conn.execute(f"SET search_path TO atomix_log_{self.number}")
            conn.execute(f"SET tcp_keepalives_idle = {idle}")
            conn.execute(f"SET tcp_keepalives_interval = {interval}")
            conn.execute(f"SET tcp_keepalives_count = {count}")
            # Ordinary records ride on the next synchronous commit (see the module docstring).
            conn.execute("SET synchronous_commit TO off")
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
        except BaseException as exc:
            conn.close()
            if isinstance(exc, pg.Error):  # the database failed, not the log: not a LogError
                raise CoordinatorError(f"log {self.location}: cannot open it in {safe_url(url)}: {exc}") from exc
            raise
        self._pg: psycopg.Connection[Any] = conn
        #: Whether closing dropped the log (it was finished: see the module docstring), and
        #: if not, why it was kept: WORK, KEYS (a dead run's keys wait for key_retention) or
        #: LOST (the connection or the drop failed: a sweep drops it later).
        self.dropped = False
        self.kept: str | None = None
        self.log_id = str(meta.get("log_id"))
        self._run_prefix = f"log{self.number}-r"
        try:
            if meta.get("format") != FORMAT:
                raise LogError(self.location, f"not an Atomix log (format {meta.get('format')!r})")
            if meta.get("version") != str(VERSION):
                raise LogError(self.location, f"log version {meta.get('version')}, this Atomix reads {VERSION}")
            self._start()
        except BaseException:
            conn.close()
            raise

    def _take(self, conn: psycopg.Connection[Any], *, create: bool) -> int:
        """Register the log if need be and take its lock: its number. A log dropped between
        the two (its holder finished it) is looked up again: gone (`LogError`), or made anew."""
        for _ in range(3):
            number = self._register(conn, create=create)
            got = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, number)).fetchone()
            if not (got and got[0]):
                raise LogBusy(self.location, "the Atomix log is in use (a live process's connection holds it)")
            if conn.execute("SELECT 1 FROM atomix_log.logs WHERE n = %s", (number,)).fetchone():
                return number
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, number))
        raise NoSuchLog(self.location, "the log keeps being removed while it is opened")

    def _register(self, conn: psycopg.Connection[Any], *, create: bool) -> int:
        """The log's number, registering it (and making its schema) if it is new."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_CLASS,))
            conn.execute("CREATE SCHEMA IF NOT EXISTS atomix_log")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS atomix_log.logs (n serial PRIMARY KEY, "
                "name text UNIQUE NOT NULL, created timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT n FROM atomix_log.logs WHERE name = %s", (self.name,)).fetchone()
            if row is not None:
                return int(row[0])
            if not create:
                raise NoSuchLog(self.location, "no Atomix log of this name in the coordinator's database")
            found = conn.execute(
                "INSERT INTO atomix_log.logs (name) VALUES (%s) RETURNING n", (self.name,)
            ).fetchone()
            assert found is not None
            number = found[0]
            schema = f"atomix_log_{int(number)}"
            conn.execute(f"CREATE SCHEMA {schema}")
            for table, (columns, key) in _TABLES.items():
                conn.execute(f"CREATE TABLE {schema}.{table} ({columns}, PRIMARY KEY ({', '.join(key)}))")
            conn.execute(
                f"INSERT INTO {schema}.meta VALUES ('format', %s), ('version', %s), ('name', %s), "
                "('log_id', %s)",
                (FORMAT, str(VERSION), self.name, secrets.token_hex(8)),
            )
            return int(number)

    # -- the storage methods of TxLog ------------------------------------------------------------
    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = self._pg.execute(to_postgres(sql), params).fetchall()
        return rows

    def _write(self, statements: Iterable[tuple[str, Any]], *, sync: bool = False) -> None:
        """One PostgreSQL transaction, sent in one round trip; `sync` commits it synchronously
        (durable, with every earlier record). Caller locks."""
        conn = self._pg
        with conn.pipeline(), conn.transaction():
            cur = conn.cursor()
            if sync and self.durable:
                cur.execute("SET LOCAL synchronous_commit TO on")
            for sql, params in statements:
                if params.__class__ is list:
                    if params:
                        cur.executemany(to_postgres(sql), params)
                else:
                    cur.execute(to_postgres(sql), params)

    def _close_store(self) -> None:
        prune: list[tuple[str, str, str]] = []
        try:
            prune = self._drop_if_finished()
        except self._db_errors as exc:
            self.kept = LOST
            warnings.warn(
                f"atomix log {self.location}: could not remove the finished log ({exc}); "
                "`atomix recover --coordinator URL` removes it later",
                RuntimeWarning,
                stacklevel=3,
            )
        finally:
            self._pg.close()  # the session's advisory lock goes with it
        _prune_keys(self.location, prune)

    def _drop_if_finished(self) -> list[tuple[str, str, str]]:
        """Drop the log if it is finished (see the module docstring); the (run, kind, path)
        stores whose applied keys this process's own runs left, to prune now. Caller locks."""
        conn = self._pg
        if conn.closed or getattr(conn, "broken", False):
            self.kept = LOST  # the log stays for a sweep
            return []
        with conn.transaction():
            # The registry's lock first: a reader of the logs (`log_statuses`) takes it shared
            # before any of their tables, so the drop and a reader never wait on each other.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (LOCK_CLASS,))
            row = conn.execute(
                "SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {t})" for t in _WORK_TABLES)
            ).fetchone()
            if row is None or row[0]:
                self.kept = WORK  # unfinished work, or a human's
                return []
            stores = [(str(r), str(k), str(p)) for r, k, p in conn.execute(
                "SELECT run_id, kind, path FROM stores").fetchall()]
            if any(run not in self.own_runs for run, _, _ in stores):
                self.kept = KEYS  # a dead run's keys wait for key_retention: for a sweep
                return []
            conn.execute("SET LOCAL synchronous_commit TO on")  # durable before any prune
            conn.execute(f"DROP SCHEMA atomix_log_{int(self.number)} CASCADE")
            conn.execute("DELETE FROM atomix_log.logs WHERE n = %s", (self.number,))
        self.dropped = True
        return stores


def _prune_keys(location: str, stores: Sequence[tuple[str, str, str]]) -> None:
    """Prune the applied keys a finished process's runs left in these stores (what recovery's
    housekeeping does after key_retention; see the module docstring). Never fatal."""
    from atomix.adapters.filesystem import FileStore
    from atomix.adapters.sqlite import SQLiteStore

    for run_id, kind, path in stores:
        try:
            if kind == "fs.write" and Path(path).is_dir():
                FileStore(path, casefold=False).prune_keys(f"{run_id}:")
            elif kind == "sqlite.row" and Path(path).exists():
                db = SQLiteStore(path)
                try:
                    db.prune_keys(f"{run_id}:")
                finally:
                    db.close()
        except Exception as exc:  # noqa: BLE001 - a key left behind only dedupes
            warnings.warn(
                f"atomix log {location}: applied keys of {run_id} not pruned from {path}: {exc}",
                RuntimeWarning,
                stacklevel=4,
            )


def coordinator_log(coordinator: object) -> TxLog:
    """The log `Runtime(coordinator=..., log="coordinator")` asks for: a new `CoordinatorLog`
    in a ``postgresql://`` coordinator's database. ValueError, saying what to do instead,
    without a coordinator or with a ``sqlite:///`` one (whose processes share a host, and so
    each keep a directory a survivor can open)."""
    url = getattr(coordinator, "url", coordinator)
    if coordinator is None or not isinstance(url, str):
        raise ValueError(
            f"Runtime(log={IN_COORDINATOR!r}) keeps the durable log in the coordinator's database: "
            "give coordinator='postgresql://...' too, or name a directory (e.g. './coordinator')"
        )
    if not url.startswith(("postgresql://", "postgres://")):
        raise ValueError(
            f"Runtime(log={IN_COORDINATOR!r}) needs a postgresql:// coordinator, not {safe_url(url)!r}: a "
            "sqlite:/// coordinator's processes share one host, so give each a directory "
            "(log=DIR), which a survivor on the host opens"
        )
    return CoordinatorLog(url)


def log_held_in(url: str, location: str | None) -> bool:
    """Whether the log in the coordinator's database that `location` names is open in a live
    process (its connection holds the log's lock). False for a directory, or when it cannot
    be told."""
    name = log_name(location)
    if name is None:
        return False
    pg = _psycopg()
    try:
        with pg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN atomix_log.logs g "
                "ON l.objid = g.n::oid WHERE g.name = %s AND l.locktype = 'advisory' "
                "AND l.classid = %s::oid AND l.objsubid = 2 AND l.granted "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
                (name, LOCK_CLASS),
            ).fetchone()
    except pg.Error:
        return False
    return bool(row and row[0])
