"""The coordinator store in PostgreSQL: many processes on many hosts.

With psycopg 3 and its pool:

- an append takes no lock: one statement (one round trip, autocommit) checks the member is
  live, inserts its batch at the sequence's next value, and reads the events between the
  caller's last seen position and its own. Positions are handed out in `nextval` order but
  committed in any order, so that read can miss an earlier position still in flight (or one
  whose appender failed): a hole. The reader fills every hole it finds with an empty batch
  (`INSERT ... ON CONFLICT DO NOTHING`, which waits for the in-flight appender's insert and
  keeps it if it commits) and reads again, so every reader sees the same gapless log. An
  appender that lost its position to a filler (it took `nextval` and was slower to insert
  than the filler) gets a unique violation and appends again at a new position;
- while a transaction of the process waits, its listener `LISTEN`s on a connection of its
  own and catches up when notified (and `UNLISTEN`s when none waits);
- leases are rows whose heartbeat is the server's clock (`now()`), so hosts' clocks do not
  matter; a recoverer takes a fenced member's row `FOR UPDATE SKIP LOCKED` and holds it in an
  open transaction while it recovers, so a second recoverer skips it, and if the first dies
  the lock dies with its connection and the row is free again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
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
    dumps_batch,
    loads,
    safe_url,
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
# An appender whose position a hole filler took appends again, at most this many times.
_APPEND_TRIES = 50
# The advisory lock's key: one 64-bit number for every append of this database's coordinator.
LOCK_KEY = 0x41544F4D4958  # "ATOMIX"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS atomix_meta (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS atomix_events (
    seq bigint PRIMARY KEY, member integer NOT NULL, body text NOT NULL);
CREATE SEQUENCE IF NOT EXISTS atomix_event_seq;
CREATE TABLE IF NOT EXISTS atomix_members (
    id serial PRIMARY KEY, status text NOT NULL, heartbeat timestamptz NOT NULL,
    log_dir text, pid integer NOT NULL, host text NOT NULL);
"""


# One round trip: the member's status (seq -1), the events after `since` that this statement's
# snapshot sees below the new row, and the new row's position (member -2). A fenced member
# inserts nothing. {notify}: wake the listeners.
_APPEND = """
WITH st AS (SELECT status FROM atomix_members WHERE id = %(m)s),
ins AS (
    INSERT INTO atomix_events (seq, member, body)
    SELECT nextval('atomix_event_seq'), %(m)s, %(b)s WHERE (SELECT status FROM st) = 'live'
    RETURNING seq)
SELECT -1::bigint, 0, coalesce((SELECT status FROM st), 'unknown')
UNION ALL
SELECT e.seq, e.member, e.body FROM atomix_events AS e
    WHERE e.seq > %(s)s AND e.seq < (SELECT seq FROM ins)
UNION ALL
SELECT seq, -2, NULL FROM ins{notify}
ORDER BY 1
"""
# Never in the append's own statement: a recoverer holds a fenced member's row (`claim`) while
# it reads the log, and its read waits for every insert in flight; an insert that waited for
# that row in turn would never end.
_RENEW = "UPDATE atomix_members SET heartbeat = now() WHERE id = %s AND status = 'live'"
_NOTIFY_ROW = f"""
UNION ALL
SELECT -3::bigint, 0, NULL FROM (SELECT pg_notify('{CHANNEL}', '')) AS n"""
_FILL = (
    "INSERT INTO atomix_events (seq, member, body) SELECT g, 0, '[]' "
    "FROM unnest(%s::bigint[]) AS g ON CONFLICT (seq) DO NOTHING"
)
_READ_SEQS = "SELECT seq, member, body FROM atomix_events WHERE seq = ANY(%s) ORDER BY seq"
_STATEMENTS = {notify: _APPEND.format(notify=_NOTIFY_ROW if notify else "") for notify in (False, True)}


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
                    # A log written before positions came from the sequence: start after it.
                    conn.execute(
                        "SELECT setval('atomix_event_seq', m) FROM (SELECT max(seq) AS m FROM "
                        "atomix_events) AS e WHERE m > (SELECT last_value FROM atomix_event_seq)"
                    )
                finally:
                    conn.execute(f"SELECT pg_advisory_unlock({LOCK_KEY})")
            self._pool = ConnectionPool(
                url, min_size=2, max_size=pool_size, kwargs={"autocommit": True}, open=True
            )
            # LISTENs only while a transaction here waits (`wait_for_news`, `quiet`): the
            # server signals every listening backend on every notify.
            self._listen = psycopg.connect(url, autocommit=True)
            self._listening = False
            # The heartbeat's own connection: it never waits for a pooled one behind appends.
            self._beat = psycopg.connect(url, autocommit=True)
        except psycopg.Error as exc:
            raise CoordinatorError(f"coordinator {safe_url(url)}: {exc}") from exc
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
                    f"coordinator {safe_url(self.url)}: its runtimes use options {row[0]}; this one "
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
    def append(
        self, member: int, since: int, batch: Sequence[dict[str, Any]], *, notify: bool = False
    ) -> list[Event]:
        body = dumps_batch(batch)
        now = time.monotonic()
        # A busy process renews its lease with its appends too.
        renew = now - self._renewed.get(member, 0.0) > 1.0
        statement = _STATEMENTS[notify]
        with self._pool.connection() as conn:
            for _ in range(_APPEND_TRIES):
                try:
                    rows = conn.execute(statement, {"m": member, "b": body, "s": since}).fetchall()
                except psycopg.errors.UniqueViolation:
                    continue  # a reader filled this position as a hole: take a new one
                break
            else:
                raise CoordinatorError(
                    f"coordinator {safe_url(self.url)}: member {member} lost its position to hole "
                    f"fillers {_APPEND_TRIES} times in a row"
                )
            status = next((r[2] for r in rows if r[0] == -1), "unknown")
            if renew and status == LIVE:
                conn.execute(_RENEW, (member,))  # (after the append committed: see _RENEW)
                self._renewed[member] = now
            own = [r for r in rows if r[1] == -2]
            if not own:
                raise Fenced(
                    f"coordinator {safe_url(self.url)}: member {member} is {status}; its writes are refused"
                )
            seq = int(own[0][0])
            found = {int(r[0]): r for r in rows if r[0] > 0 and r[1] != -2}
            events = self._gapless(conn, since, seq - 1, found)
        events.append(Event(seq, member, list(batch)))
        return events

    def _gapless(
        self, conn: psycopg.Connection[Any], since: int, upto: int, found: dict[int, Any]
    ) -> list[Event]:
        """The events since+1..upto from `found`, the holes among them filled and read."""
        missing = [s for s in range(since + 1, upto + 1) if s not in found]
        if missing:
            with conn.pipeline():
                conn.execute(_FILL, (missing,))
                cur = conn.execute(_READ_SEQS, (missing,))
            for row in cur.fetchall():
                found[int(row[0])] = row
        return [
            Event(s, int(found[s][1]), loads(found[s][2])) for s in range(since + 1, upto + 1)
        ]

    def read(self, since: int) -> list[Event]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT seq, member, body FROM atomix_events WHERE seq > %s ORDER BY seq", (since,)
            ).fetchall()
            if not rows:
                return []
            return self._gapless(conn, since, int(rows[-1][0]), {int(r[0]): r for r in rows})

    def wait_for_news(self, since: int, timeout: float) -> bool:
        with self._listen_lock:
            if not self._listening:  # before the look at the log: no news falls between
                self._listen.execute(f"LISTEN {CHANNEL}")
                self._listening = True
            # Drop what queued meanwhile: the look at the log below covers it.
            for _ in self._listen.notifies(timeout=0):
                pass
            row = self._listen.execute("SELECT max(seq) FROM atomix_events").fetchone()
            if row is not None and (row[0] or 0) > since:
                return True
            for _ in self._listen.notifies(timeout=timeout, stop_after=1):
                return True
        return False

    def quiet(self) -> None:
        """No transaction here waits any more: stop listening (see `__init__`)."""
        with self._listen_lock:
            if self._listening:
                self._listen.execute(f"UNLISTEN {CHANNEL}")
                self._listening = False

    def close(self) -> None:
        for member in list(self._claims):
            self.release(member, recovered=False)
        with self._listen_lock:
            self._listen.close()
        with self._beat_lock:
            self._beat.close()
        self._pool.close()

