"""Shared reads: reads never conflict with reads, so a transaction that only reads a scope never
waits for an earlier reader of it, open, sealed or waiting. What still orders transactions is a
write: a writer waits for every earlier access to what it writes, a reader for earlier writers,
and a read that a later commit overtook is stale (version validation at commit, or
abort-on-stale for a late access; docs/design.md, "The model").

These drive the core directly (the protocol is the core's) and once through the threaded
runtime, where a regression would block instead of returning a Wait.
"""

from __future__ import annotations

import threading

from atomix.decisions import AbortPlan, CommitPlan, Proceed, Wait
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.runtime import Runtime
from atomix.transaction import Transaction, TxState

X = "kv:t:1"
Y = "kv:t:2"
TABLE = "kv:t"


def put(mgr: TransactionManager, scope: str, key: str) -> Effect:
    return Effect("put", EffectClass.BUFFERABLE, (mgr.scope(scope),), key)


def try_commit(mgr: TransactionManager, tx: Transaction) -> CommitPlan | Wait | AbortPlan:
    if tx.state is TxState.OPEN:
        mgr.seal(tx.txid)
    return mgr.try_commit(tx.txid)


def finish(mgr: TransactionManager, tx: Transaction) -> list[int]:
    return mgr.finish(tx.txid)[1]


# ------------------------------------------------------------------------- readers and readers


def test_a_reader_does_not_wait_for_an_earlier_open_reader() -> None:
    mgr = TransactionManager()
    first, second = mgr.begin(), mgr.begin()
    assert isinstance(mgr.read(first.txid, [X]), Proceed)
    assert isinstance(mgr.read(second.txid, [X]), Proceed)
    assert mgr.blockers(second.txid) == []
    assert isinstance(try_commit(mgr, second), CommitPlan)  # the earlier one is still open


def test_a_reader_does_not_wait_for_an_earlier_sealed_or_waiting_reader() -> None:
    mgr = TransactionManager()
    writer, sealed, waiting, late = (mgr.begin() for _ in range(4))
    assert isinstance(mgr.stage(writer.txid, put(mgr, Y, "w")), Proceed)
    for reader in (sealed, waiting, late):
        assert isinstance(mgr.read(reader.txid, [X]), Proceed)
    mgr.seal(sealed.txid)
    assert isinstance(mgr.read(waiting.txid, [Y]), Proceed)  # also reads what `writer` writes
    assert isinstance(try_commit(mgr, waiting), Wait)
    assert waiting.state is TxState.WAITING
    assert isinstance(try_commit(mgr, late), CommitPlan)  # neither reader holds it up


def test_readers_of_a_table_and_of_its_row_do_not_wait_for_each_other() -> None:
    mgr = TransactionManager()
    whole, row = mgr.begin(), mgr.begin()
    mgr.read(whole.txid, [TABLE])
    mgr.read(row.txid, [X])
    assert isinstance(try_commit(mgr, row), CommitPlan)
    mgr.finish(row.txid)
    assert isinstance(try_commit(mgr, whole), CommitPlan)


def test_many_readers_commit_in_any_order() -> None:
    mgr = TransactionManager()
    readers = [mgr.begin() for _ in range(6)]
    for tx in readers:
        assert isinstance(mgr.read(tx.txid, [TABLE, X]), Proceed)
    for tx in reversed(readers):  # latest first: none waits for an earlier one
        assert isinstance(try_commit(mgr, tx), CommitPlan)
        assert finish(mgr, tx) == []


def test_the_global_frontier_ablation_still_orders_readers() -> None:
    """One global frontier is one ordered lock over everything: sharing reads is a property
    of per-resource frontiers, and the ablation keeps its own meaning."""
    mgr = TransactionManager(RuntimeOptions(frontier="global"))
    first, second = mgr.begin(), mgr.begin()
    mgr.read(first.txid, [X])
    mgr.read(second.txid, [X])
    wait = try_commit(mgr, second)
    assert isinstance(wait, Wait) and [b.txid for b in wait.blockers] == [first.txid]


# ------------------------------------------------------------------------- readers and writers


def test_a_reader_commits_only_after_an_earlier_writer_and_is_then_stale() -> None:
    mgr = TransactionManager()
    writer, reader = mgr.begin(), mgr.begin()
    assert isinstance(mgr.stage(writer.txid, put(mgr, X, "w")), Proceed)
    assert isinstance(mgr.read(reader.txid, [X]), Proceed)  # reads the value before the write
    wait = try_commit(mgr, reader)
    assert isinstance(wait, Wait) and [b.txid for b in wait.blockers] == [writer.txid]
    assert isinstance(try_commit(mgr, writer), CommitPlan)
    assert finish(mgr, writer) == [reader.txid]
    plan = mgr.try_commit(reader.txid)
    assert isinstance(plan, AbortPlan) and plan.source is AbortSource.STALE_READ


def test_a_writer_waits_for_every_earlier_reader_of_what_it_writes() -> None:
    mgr = TransactionManager()
    r1, r2, writer = mgr.begin(), mgr.begin(), mgr.begin()
    mgr.read(r1.txid, [X])
    mgr.read(r2.txid, [TABLE])  # covers X
    mgr.stage(writer.txid, put(mgr, X, "w"))
    wait = try_commit(mgr, writer)
    assert isinstance(wait, Wait)
    assert {b.txid for b in wait.blockers} == {r1.txid, r2.txid}
    for reader in (r1, r2):
        assert isinstance(try_commit(mgr, reader), CommitPlan)
    assert finish(mgr, r1) + finish(mgr, r2) == [writer.txid]  # woken once, by the last
    assert isinstance(mgr.try_commit(writer.txid), CommitPlan)


def test_a_read_overtaken_by_a_later_readers_commit_is_late_when_it_writes() -> None:
    """The earlier reader did not hold the later one up. If it then writes what both read,
    the later one has committed on a state that does not include it: epoch order would be
    broken, so the earlier one aborts as stale (a late access)."""
    mgr = TransactionManager()
    early, late = mgr.begin(), mgr.begin()
    mgr.read(early.txid, [X])
    mgr.read(late.txid, [X])
    assert isinstance(try_commit(mgr, late), CommitPlan)
    mgr.finish(late.txid)
    plan = mgr.stage(early.txid, put(mgr, X, "too late"))
    assert isinstance(plan, AbortPlan) and plan.source is AbortSource.STALE_READ


def test_a_reader_that_becomes_a_writer_is_waited_for_by_a_later_reader() -> None:
    mgr = TransactionManager()
    upgrader, reader = mgr.begin(), mgr.begin()
    mgr.read(upgrader.txid, [X])
    mgr.read(reader.txid, [X])
    assert mgr.blockers(reader.txid) == []
    mgr.stage(upgrader.txid, put(mgr, X, "w"))  # now it writes what the later one read
    assert [b.txid for b in mgr.blockers(reader.txid)] == [upgrader.txid]


def test_a_reader_does_not_wait_for_an_earlier_reader_that_writes_elsewhere() -> None:
    mgr = TransactionManager()
    other, reader = mgr.begin(), mgr.begin()
    mgr.read(other.txid, [X])
    mgr.stage(other.txid, put(mgr, Y, "w"))  # writes a sibling row, reads X
    mgr.read(reader.txid, [X])
    assert isinstance(try_commit(mgr, reader), CommitPlan)


# ------------------------------------------------------------------------------- the runtime


def test_runtime_readers_of_one_scope_do_not_block_each_other() -> None:
    """The first transaction stays open (its block is not left) while the second, on another
    thread, reads the same scope and commits. A second reader that waited for the first
    would time out (the runtime aborts a wait past `timeout`), and the test would see it."""
    rt = Runtime(timeout=5.0)
    values = {"x": 1}
    get = rt.tool(lambda k: values[k], reads="kv:{k}", name="get")
    results: list[object] = []

    with rt.transaction() as first:
        assert get("x") == 1

        def second() -> None:
            try:
                with rt.transaction():
                    results.append(get("x"))
            except Exception as exc:  # noqa: BLE001 - reported below
                results.append(exc)

        worker = threading.Thread(target=second)
        worker.start()
        worker.join(30)
        assert not worker.is_alive()
        assert results == [1]
        assert first.state is TxState.OPEN
    assert [s.outcome for s in rt.settlements] == ["committed", "committed"]
