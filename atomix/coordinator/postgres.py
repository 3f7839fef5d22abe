"""The coordinator store in PostgreSQL: many processes on many hosts.

With psycopg 3 and its pool:

- an append is one transaction that first takes a transaction-scoped advisory lock
  (`pg_advisory_xact_lock`), so appends are serialised and commit in log order, then reads
  the events its replica has not seen (READ COMMITTED: a statement after the lock sees every
  append committed before it), then inserts its own and, when they can wake a waiter,
  `NOTIFY`s; the lock goes with the commit;
- waiters `LISTEN` on a connection of their own and catch up when notified;
- leases are rows whose heartbeat is the server's clock (`now()`), so hosts' clocks do not
  matter; a recoverer takes a fenced member's row `FOR UPDATE SKIP LOCKED` and holds it in an
  open transaction while it recovers, so a second recoverer skips it, and if the first dies
  the lock dies with its connection and the row is free again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from atomix.coordinator.store import (
    FENCED,
    LEFT,
    LIVE,
    RECOVERED,
    CoordinatorError,
    Event,
    Fenced,
    Member,
    Step,
    dumps,
    loads,
)

try:
    import psycopg
    from psycopg_pool import ConnectionPool
except ImportError as _exc:  # pragma: no cover - depends on the install
    raise CoordinatorError(
        "a postgresql:// coordinator needs psycopg 3 and psycopg_pool: "
        "pip install 'atomix-tx[coordinator]'"
    ) from _exc

CHANNEL = "atomix_events"
# The advisory lock's key: one 64-bit number for every append of this database's coordinator.
LOCK_KEY = 0x41544F4D4958  # "ATOMIX"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS atomix_meta (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS atomix_events (
    seq bigint PRIMARY KEY, member integer NOT NULL, body text NOT NULL);
CREATE TABLE IF NOT EXISTS atomix_members (
    id serial PRIMARY KEY, status text NOT NULL, heartbeat timestamptz NOT NULL,
    log_dir text, pid integer NOT NULL, host text NOT NULL);
"""


_LOCK = f"SELECT pg_advisory_xact_lock({LOCK_KEY})"
# The member's status first (seq -1), then the events after `since`.
_READ = (
    "SELECT * FROM (SELECT -1 AS seq, 0 AS member, status AS body FROM atomix_members "
    "WHERE id = %s UNION ALL SELECT seq, member, body FROM atomix_events WHERE seq > %s) AS q "
    "ORDER BY seq"
)
_INSERT = (
    "INSERT INTO atomix_events (seq, member, body) "
    "SELECT s, %s, b FROM unnest(%s::bigint[], %s::text[]) AS u(s, b)"
)
_NOTIFY = f"SELECT pg_notify('{CHANNEL}', %s)"
_RENEW = "UPDATE atomix_members SET heartbeat = now() WHERE id = %s"


class PostgresStore:
    """The store of a ``postgresql://`` coordinator (see the module docstring).

    Guarantees: appends are totally ordered across every process and host on the database;
    a fenced member's append is refused before its step runs; a read sees a prefix of the
    log; at most one recoverer holds a fenced member at a time."""

    polls = False  # waiters are notified

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self.url = url
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"SELECT pg_advisory_lock({LOCK_KEY})")
                try:
                    conn.execute(_SCHEMA)
                finally:
                    conn.execute(f"SELECT pg_advisory_unlock({LOCK_KEY})")
            self._pool = ConnectionPool(
                url, min_size=2, max_size=pool_size, kwargs={"autocommit": True}, open=True
            )
            self._listen = psycopg.connect(url, autocommit=True)
            self._listen.execute(f"LISTEN {CHANNEL}")
            # The heartbeat's own connection: it never waits for a pooled one behind appends.
            self._beat = psycopg.connect(url, autocommit=True)
        except psycopg.Error as exc:
            raise CoordinatorError(f"coordinator {_safe(url)}: {exc}") from exc
        self._listen_lock = threading.Lock()
        self._beat_lock = threading.Lock()
        self._claims: dict[int, psycopg.Connection[Any]] = {}
        self._renewed: dict[int, float] = {}

    # -- members --------------------------------------------------------------------------
    def register(self, *, pid: int, host: str, log_dir: str | None, options: str) -> int:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(f"SELECT pg_advisory_xact_lock({LOCK_KEY})")
            row = conn.execute("SELECT value FROM atomix_meta WHERE name = 'options'").fetchone()
            if row is None:
                conn.execute("INSERT INTO atomix_meta VALUES ('options', %s)", (options,))
            elif row[0] != options:
                raise CoordinatorError(
                    f"coordinator {_safe(self.url)}: its runtimes use options {row[0]}; this one "
                    f"has {options}: every runtime on one coordinator must use the same"
                )
            found = conn.execute(
                "INSERT INTO atomix_members (status, heartbeat, log_dir, pid, host) "
                "VALUES (%s, now(), %s, %s, %s) RETURNING id",
                (LIVE, log_dir, pid, host),
            ).fetchone()
        assert found is not None
        return int(found[0])

    def heartbeat(self, member: int) -> bool:
        # (Takes no advisory lock: a heartbeat never queues behind appends.)
        with self._beat_lock:
            cur = self._beat.execute(
                "UPDATE atomix_members SET heartbeat = now() WHERE id = %s AND status = %s",
                (member, LIVE),
            )
            return cur.rowcount == 1

    def fence_expired(self, lease: float, alive: Callable[[Member], bool] | None = None) -> list[int]:
        expired = "status = %s AND heartbeat < now() - make_interval(secs => %s)"
        with self._pool.connection() as conn:
            rows = conn.execute(
                f"SELECT id, status, log_dir, pid, host FROM atomix_members WHERE {expired}",
                (LIVE, lease),
            ).fetchall()
            late = [Member(int(r[0]), r[1], r[2], int(r[3]), r[4]) for r in rows]
            # Late, but provably alive: never fenced. The rest only if still late now.
            dead = [m.id for m in late if alive is None or not alive(m)]
            if not dead:
                return []
            fenced = conn.execute(
                f"UPDATE atomix_members SET status = %s WHERE id = ANY(%s) AND {expired} RETURNING id",
                (FENCED, dead, LIVE, lease),
            ).fetchall()
        return [int(r[0]) for r in fenced]

    def fence(self, member: int) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                "UPDATE atomix_members SET status = %s WHERE id = %s AND status = %s",
                (FENCED, member, LIVE),
            )

    def claim(self, recoverer: int) -> Member | None:
        conn = self._pool.getconn()
        try:
            conn.execute("BEGIN")
            row = conn.execute(
                "SELECT id, status, log_dir, pid, host FROM atomix_members WHERE status = %s "
                "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
                (FENCED,),
            ).fetchone()
        except BaseException:
            conn.execute("ROLLBACK")
            self._pool.putconn(conn)
            raise
        if row is None:
            conn.execute("ROLLBACK")
            self._pool.putconn(conn)
            return None
        self._claims[int(row[0])] = conn  # the row stays locked until release
        return Member(int(row[0]), row[1], row[2], int(row[3]), row[4])

    def release(self, member: int, *, recovered: bool) -> None:
        conn = self._claims.pop(member)
        try:
            if recovered:
                conn.execute("UPDATE atomix_members SET status = %s WHERE id = %s", (RECOVERED, member))
                conn.execute("COMMIT")
            else:
                conn.execute("ROLLBACK")
        finally:
            self._pool.putconn(conn)

    def members(self) -> list[Member]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT id, status, log_dir, pid, host FROM atomix_members ORDER BY id"
            ).fetchall()
        return [Member(int(r[0]), r[1], r[2], int(r[3]), r[4]) for r in rows]

    def leave(self, member: int) -> None:
        with self._pool.connection() as conn:
            conn.execute(
                "UPDATE atomix_members SET status = %s WHERE id = %s AND status = %s",
                (LEFT, member, LIVE),
            )

    # -- the log ---------------------------------------------------------------------------
    def append(self, member: int, since: int, step: Step) -> tuple[Any, int]:
        # Two round trips, in pipeline mode: (BEGIN, lock, read) and (insert, notify, renew,
        # COMMIT). The lock is held from the first to the second: one round trip and the
        # replica's step, which is what bounds the appends per second of the whole log. The
        # lock and the read must be two statements: a statement's snapshot is taken before
        # it runs, so a read in the locking statement could miss the last holder's events.
        with self._pool.connection() as conn:
            try:
                with conn.pipeline() as pipe:
                    conn.execute("BEGIN")
                    conn.execute(_LOCK)
                    cur = conn.execute(_READ, (member, since))
                    pipe.sync()
                    rows = cur.fetchall()
                    if not rows or rows[0][0] != -1 or rows[0][2] != LIVE:
                        status = rows[0][2] if rows and rows[0][0] == -1 else "unknown"
                        raise Fenced(
                            f"coordinator {_safe(self.url)}: member {member} is {status}; "
                            "its writes are refused"
                        )
                    events = [Event(int(s), int(m), loads(b)) for s, m, b in rows[1:]]
                    last = events[-1].seq if events else since
                    result, bodies = step(events)
                    if bodies:
                        seqs = list(range(last + 1, last + 1 + len(bodies)))
                        conn.execute(_INSERT, (member, seqs, [dumps(b) for b in bodies]))
                        if any(b.get("n") for b in bodies):  # it can wake a waiter: tell them
                            conn.execute(_NOTIFY, (str(seqs[-1]),))
                        last = seqs[-1]
                    now = time.monotonic()
                    if now - self._renewed.get(member, 0.0) > 1.0:
                        # A busy process renews its lease with its appends too.
                        conn.execute(_RENEW, (member,))
                        self._renewed[member] = now
                    conn.execute("COMMIT")
            except BaseException:
                if not conn.closed:
                    conn.execute("ROLLBACK")
                raise
        return result, last

    def read(self, since: int) -> list[Event]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT seq, member, body FROM atomix_events WHERE seq > %s ORDER BY seq", (since,)
            ).fetchall()
        return [Event(int(s), int(m), loads(b)) for s, m, b in rows]

    def wait_for_news(self, since: int, timeout: float) -> bool:
        with self._listen_lock:
            row = self._listen.execute("SELECT max(seq) FROM atomix_events").fetchone()
            if row is not None and (row[0] or 0) > since:
                return True
            for _ in self._listen.notifies(timeout=timeout, stop_after=1):
                return True
        return False

    def close(self) -> None:
        for member in list(self._claims):
            self.release(member, recovered=False)
        with self._listen_lock:
            self._listen.close()
        with self._beat_lock:
            self._beat.close()
        self._pool.close()


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return url
