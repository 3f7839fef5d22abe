"""The shared log's order without a lock: holes, lost positions, and fences in the log.

PostgreSQL hands out positions with a sequence and commits them in any order, so a reader
can see a position still in flight, or one whose appender died between taking it and
inserting: a hole. These cases make each situation happen on purpose, against a real server,
and check that every reader still gets the same gapless log. The fence cases run on both
coordinators: a member fenced in the log gets no decision for a call it makes afterwards,
even when the store still takes its append.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from coordinator_support import pg_fixture, pg_url_fixture, url_fixture  # noqa: F401

from atomix import Runtime
from atomix.adapters.sqlite import SQLiteStore
from atomix.adapters.tools import sqlite_tools
from atomix.coordinator import CoordinatorSettings, Fenced
from atomix.coordinator.postgres import PostgresStore


def _store(url: str) -> tuple[PostgresStore, int]:
    store = PostgresStore(url)
    member = store.register(pid=1, host="h", log_dir=None, options="o")
    return store, member


def _positions(events: list) -> list[int]:  # type: ignore[type-arg]
    return [e.seq for e in events]


def test_a_position_taken_and_never_written_is_filled_as_a_hole(pg_url: str) -> None:
    """An appender took a position and died before inserting it: the next reader fills it
    with an empty batch, and every reader then sees the same log, with no gap."""
    store, member = _store(pg_url)
    try:
        first = store.append(member, 0, [{"k": "a"}])
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as dead:
            lost = dead.execute("SELECT nextval('atomix_event_seq')").fetchone()[0]
        after = store.append(member, first[-1].seq, [{"k": "b"}])
        assert _positions(after) == [lost, lost + 1]
        hole = after[0]
        assert hole.body == [] and hole.member == 0
        assert after[-1].body == [{"k": "b"}]
        # A second reader from the start gets the same log.
        assert [(e.seq, e.body) for e in store.read(0)] == [
            (first[0].seq, [{"k": "a"}]), (lost, []), (lost + 1, [{"k": "b"}])
        ]
    finally:
        store.close()


def test_a_reader_waits_for_an_append_in_flight_and_keeps_it(pg_url: str) -> None:
    """An append that took its position and has not committed yet is not a hole: the reader
    waits for it, and reads its batch once it commits."""
    import psycopg

    store, member = _store(pg_url)
    try:
        store.append(member, 0, [{"k": "a"}])
        slow = psycopg.connect(pg_url)
        slow.execute(
            "INSERT INTO atomix_events (seq, member, body) "
            "VALUES (nextval('atomix_event_seq'), %s, '[{\"k\": \"slow\"}]')",
            (member,),
        )  # not committed: in flight
        got: list = []  # type: ignore[type-arg]
        reader = threading.Thread(target=lambda: got.append(store.append(member, 1, [{"k": "c"}])))
        reader.start()
        time.sleep(0.5)
        assert not got  # the reader waits for the position in flight
        slow.commit()
        slow.close()
        reader.join(10)
        assert got, "the reader never returned"
        bodies = [e.body for e in got[0]]
        assert bodies == [[{"k": "slow"}], [{"k": "c"}]]
    finally:
        store.close()


def test_an_appender_whose_position_was_filled_appends_again(pg_url: str) -> None:
    """Readers filled the next two positions as holes before this appender inserted (it took
    them, then stalled): its inserts fail on the unique position, and it appends at the next
    free one, after the holes."""
    import psycopg

    store, member = _store(pg_url)
    try:
        store.append(member, 0, [{"k": "a"}])
        with psycopg.connect(pg_url, autocommit=True) as filler:
            nxt = filler.execute("SELECT last_value FROM atomix_event_seq").fetchone()[0]
            filler.execute(
                "INSERT INTO atomix_events (seq, member, body) VALUES (%s, 0, '[]'), (%s, 0, '[]')",
                (nxt + 1, nxt + 2),
            )
        events = store.append(member, 1, [{"k": "b"}])
        assert _positions(events) == [nxt + 1, nxt + 2, nxt + 3]
        assert [e.body for e in events] == [[], [], [{"k": "b"}]]
    finally:
        store.close()


def test_many_appenders_at_once_leave_one_gapless_order(pg_url: str) -> None:
    """Eight threads, each with its own store (connections), append at once; every one's
    view and a final read agree on one order with no gap, and nothing is lost."""
    stores = [_store(pg_url) for _ in range(8)]
    views: list[list] = [[] for _ in stores]  # type: ignore[type-arg]

    def work(i: int) -> None:
        store, member = stores[i]
        seen = 0
        for n in range(40):
            events = store.append(member, seen, [{"k": "w", "i": i, "n": n}])
            views[i].extend(events)
            seen = events[-1].seq

    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        log = stores[0][0].read(0)
        assert _positions(log) == list(range(1, len(log) + 1))
        written = sorted((b["i"], b["n"]) for e in log for b in e.body)
        assert written == sorted((i, n) for i in range(8) for n in range(40))
        by_seq = {e.seq: e.body for e in log}
        for view in views:
            assert _positions(view) == list(range(1, len(view) + 1))
            assert all(by_seq[e.seq] == e.body for e in view)
    finally:
        for store, _ in stores:
            store.close()


def test_a_member_fenced_in_the_log_gets_no_decision_after_its_fence(url: str, tmp_path: Path) -> None:
    """A recoverer's fence lands in the log before the fenced member's commit does (the
    store still takes the member's append: its lease row says live). Every replica skips the
    commit, the member gets `Fenced` instead of a decision, and the survivor's settlement
    aborts the transaction: the write never lands."""
    db_path = tmp_path / "rows.db"
    settings = dict(lease=60.0, recover_others=False)
    slow = Runtime(coordinator=CoordinatorSettings(url, **settings))  # type: ignore[arg-type]
    fast = Runtime(coordinator=CoordinatorSettings(url, **settings))  # type: ignore[arg-type]
    try:
        slow_db = sqlite_tools(slow, SQLiteStore(db_path))
        fast_db = sqlite_tools(fast, SQLiteStore(db_path))
        tx = slow.transaction()
        tx.__enter__()
        slow_db.put("t", "k", "late")
        assert slow.membership is not None and fast.membership is not None
        dead = slow.membership.member
        fast.membership.replica.fence_member(dead)
        with pytest.raises(Fenced, match="fenced in the log"):
            tx.__exit__(None, None, None)
        assert fast.membership.replica.settle_member(dead, compensated=True, by="test") == [tx.txid]
        with fast.transaction():
            fast_db.put("t", "k", "fresh")  # the scope was released
        assert SQLiteStore(db_path).get("t", "k") == "fresh"
        # The store took the late commit (it is in the log), and no replica acted on it.
        log = fast.membership.store.read(0)
        late = [e for e in log if e.member == dead and any(b["k"] == "commit" for b in e.body)]
        fence = [e for e in log if any(b["k"] == "fence" for b in e.body)]
        assert late and fence and late[0].seq > fence[0].seq
        slow.membership.replica.catch_up()
        assert slow.membership.replica.active_everywhere() == []
    finally:
        fast.close()
        slow.close()


def test_an_append_is_never_held_by_its_members_lease_row(pg_url: str) -> None:
    """A recoverer holds a member's lease row while it reads the log, and that read waits for
    every insert in flight. So a member's insert must commit without touching its lease row:
    here the row is locked, the member's append is due to renew its lease, and another
    member's append (whose read needs the first one's position) still returns at once."""
    import psycopg

    store_a, a = _store(pg_url)
    store_b, b = _store(pg_url)
    holder = psycopg.connect(pg_url)
    try:
        seen = store_b.append(b, 0, [{"k": "start"}])[-1].seq
        holder.execute("SELECT id FROM atomix_members WHERE id = %s FOR UPDATE", (a,))
        store_a._renewed.clear()  # its lease renewal is due with this append
        done: list = []  # type: ignore[type-arg]
        t = threading.Thread(target=lambda: done.append(store_a.append(a, seen, [{"k": "a"}])))
        t.start()
        time.sleep(0.3)
        got: list = []  # type: ignore[type-arg]
        other = threading.Thread(target=lambda: got.append(store_b.append(b, seen, [{"k": "b"}])))
        other.start()
        other.join(5)
        assert got, "the other member's append waited on the locked lease row"
        assert [e.body for e in got[0]] == [[{"k": "a"}], [{"k": "b"}]]
    finally:
        holder.rollback()
        holder.close()
        t.join(10)
        store_a.close()
        store_b.close()
    assert done, "the member's append never returned once its row was free"
