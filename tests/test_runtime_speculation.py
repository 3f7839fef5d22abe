"""The public runtime's speculation: branches of a group, resolve (the winner commits, the
losers are undone before it lands), first-to-succeed commits racing in threads, and what is
left tracked afterwards."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from runtime_world import JOIN, World, _book_key
from support import wait_until

from atomix import Runtime, TransactionAborted


# ================================================================================ speculation
def _speculate(w: World, group: str, k: int, fail: int | None = None) -> list[Any]:
    branches = [w.rt.branch(group, i) for i in range(k)]
    for i, branch in enumerate(branches):
        try:
            with branch:
                w.put("answer", i)  # every branch stages the same logical write
                w.send(f"user{i}", f"from branch {i}")
                w.book(100 + i)
                w.book(200 + i)
                if i == fail:
                    raise RuntimeError(f"branch {i} failed")
        except RuntimeError:
            pass
    return branches


def test_resolve_commits_the_winner_and_none_of_the_losers(w: World) -> None:
    branches = _speculate(w, "g", 4)
    # Before resolve: only reversible effects ran; nothing staged or gated has left.
    assert w.store == {} and w.outbox == []
    assert w.seats == {100, 101, 102, 103, 200, 201, 202, 203}
    winner, losers = w.rt.resolve("g", branches[2])
    assert winner.committed and winner.group == "g" and winner.waited == 0.0
    assert len(winner.applied) == len(winner.released) == 1 and len(winner.accepted) == 2
    assert w.store == {"answer": 2} and w.outbox == [("user2", "from branch 2")]
    assert w.seats == {102, 202}
    assert [s.txid for s in losers] == [branches[i].txid for i in (0, 1, 3)]
    for branch, s in zip((branches[i] for i in (0, 1, 3)), losers, strict=True):
        assert branch.settlement is s  # the loser's own handle sees its settlement
        assert s.outcome == "aborted" and s.abort_source == "losing_speculation"
        assert len(s.dropped) == 2 and len(s.compensated) == 2 and s.clean
        assert s.applied == s.released == s.accepted == ()
        # Compensated in reverse order: seat 2xx before seat 1xx.
        i = branches.index(branch)
        assert s.compensated == (_book_key(w, branch, 200 + i), _book_key(w, branch, 100 + i))
    for i in (0, 1, 3):
        assert w.log.index(f"cancel {200 + i}") < w.log.index(f"cancel {100 + i}")
    assert not any(line.startswith("send user") and line != "send user2" for line in w.log)
    assert branches[0].abort() is losers[0]  # settled already: abort is a no-op


def test_resolve_with_a_failed_winner_raises_and_still_aborts_the_losers(w: World) -> None:
    branches = _speculate(w, "g", 3, fail=0)
    with pytest.raises(TransactionAborted) as info:
        w.rt.resolve("g", branches[0])
    assert info.value.source == "tool_failure"
    assert info.value.settlement is branches[0].settlement
    assert all(b.settlement is not None and not b.settlement.committed for b in branches)
    assert w.store == {} and w.outbox == [] and w.seats == set()


def test_a_branch_committed_first_wins_and_its_siblings_are_undone_before_it_lands(
    w: World,
) -> None:
    """First to succeed: `branch.commit()` is resolve with itself as the winner, so a live
    sibling's compensation on the same seat runs before, never after, the winner's booking."""
    a, b = w.rt.branch("g", 0), w.rt.branch("g", 1)
    with a:
        w.book(5)  # reversible: seat 5 is taken eagerly by branch 0
    with b:
        w.put("answer", "b")
    s = b.commit()
    assert s.committed and w.store == {"answer": "b"}
    assert a.settlement is not None and a.settlement.abort_source == "losing_speculation"
    assert w.seats == set() and w.log.index("cancel 5") < w.log.index("put answer=b")
    with pytest.raises(TransactionAborted):
        a.commit()  # the loser cannot commit afterwards


def test_branches_that_all_fail_leave_nothing_tracked(w: World) -> None:
    first = _speculate(w, "gone", 3, fail=0)
    for i in (1, 2):  # others fail too, on their own
        with pytest.raises(RuntimeError), w.rt.branch("gone", 10 + i):
            w.book(300 + i)
            raise RuntimeError("failed")
    # only the two sealed, live branches still await resolve
    assert {t.txid for t in w.rt.core.active()} == {first[1].txid, first[2].txid}
    winner, losers = w.rt.resolve("gone", _speculate(w, "gone", 1)[0])
    assert winner.committed and len(losers) == 2  # 2 sealed live ones; the failures settled
    assert w.rt.core.active() == [] and w.rt.core._groups == {} and w.rt.core._txs == {}


@pytest.mark.parametrize("round_", range(5))
def test_branches_committing_at_once_in_threads_leave_exactly_one_winner(round_: int) -> None:
    w = World()
    k = 6
    branches = [w.rt.branch(f"race{round_}", i) for i in range(k)]
    start = threading.Barrier(k)
    outcome: dict[int, str] = {}

    def run(i: int) -> None:
        with branches[i]:
            w.book(10 * round_ + i)  # reversible: runs now, compensated if the branch loses
            w.put("answer", i)
        start.wait(JOIN)
        try:
            outcome[i] = "committed" if branches[i].commit().committed else "?"
        except TransactionAborted as exc:
            outcome[i] = exc.source

    threads = [threading.Thread(target=run, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN)
    assert not any(t.is_alive() for t in threads)
    winners = [i for i, o in outcome.items() if o == "committed"]
    assert len(outcome) == k and len(winners) == 1, outcome
    assert all(o == "losing_speculation" for i, o in outcome.items() if i not in winners)
    (win,) = winners
    assert w.store == {"answer": win} and w.seats == {10 * round_ + win}
    assert all(b.settlement is not None for b in branches)
    assert w.rt.core.active() == [] and w.rt.core._groups == {} and w.rt.core._txs == {}


def test_a_rival_resolving_while_the_winner_compensates_it_loses_cleanly(w: World) -> None:
    """Two first-to-succeed commits race: a resolves and, outside the lock, is running b's
    compensation when b's own resolve arrives. b must lose without settling itself a second
    time, and must not displace a as the winner."""
    a, b = w.rt.branch("g", 0), w.rt.branch("g", 1)
    with b:
        w.book(7)
    with a:
        w.put("answer", "a")
    rival: dict[str, Any] = {}

    def rival_resolves() -> None:
        try:
            w.rt.resolve("g", b)
        except TransactionAborted as exc:
            rival["exc"] = exc

    def cancel_hook() -> None:  # runs inside a's resolve, while b is aborted but unsettled
        t = threading.Thread(target=rival_resolves)
        t.start()
        t.join(JOIN)

    w.cancel_hooks.append(cancel_hook)
    winner, losers = w.rt.resolve("g", a)
    assert winner.committed and w.store == {"answer": "a"} and w.seats == set()
    assert rival["exc"].source == "losing_speculation" and rival["exc"].txid == b.txid
    assert [s.txid for s in losers] == [b.txid] and b.settlement is losers[0]
    assert w.rt.core.active() == [] and w.rt.core._groups == {} and w.rt.core._txs == {}


def test_many_branches_and_a_non_group_transaction(w: World) -> None:
    branches = _speculate(w, "g16", 16)
    winner, losers = w.rt.resolve("g16", branches[15])
    assert len(losers) == 15 and w.store == {"answer": 15}
    with w.rt.transaction() as after:  # a later transaction on the same scope is not blocked
        w.put("answer", "after")
    assert after.settlement is not None and after.settlement.waited == 0.0
    assert w.store == {"answer": "after"}


def test_speculation_without_kept_settlements() -> None:
    w = World(Runtime(keep_settlements=False, timeout=JOIN))
    for round_ in range(3):
        branches = _speculate(w, f"g{round_}", 3)
        winner, losers = w.rt.resolve(f"g{round_}", branches[1])
        assert winner.committed and len(losers) == 2
    assert w.rt.settlements == [] and w.rt.core.active() == []
    assert w.rt.core._txs == {}  # every finished branch was forgotten, none too early


def test_resolve_wakes_a_losing_branch_that_is_still_waiting(w: World) -> None:
    release = threading.Event()
    holding = threading.Event()

    def earlier() -> None:  # an earlier transaction holds seat 1 with an eager effect
        with w.rt.transaction():
            w.book(1)
            holding.set()
            assert release.wait(JOIN)

    holder = threading.Thread(target=earlier)
    holder.start()
    assert holding.wait(JOIN)
    branches = [w.rt.branch("g", i) for i in range(2)]
    outcome: dict[str, Any] = {}

    def loser() -> None:
        try:
            with branches[0]:
                w.book(1)  # waits for the earlier transaction on seat 1
        except TransactionAborted as exc:
            outcome["exc"] = exc

    t = threading.Thread(target=loser)
    t.start()
    wait_until(lambda: branches[0].txid in w.rt.coordinator._wakers, "the branch waits")
    with branches[1]:
        w.put("answer", 1)
    winner, losers = w.rt.resolve("g", branches[1])
    t.join(JOIN)  # (were it not woken, it would wait out its own time-out: source "timeout")
    alive = t.is_alive()
    release.set()
    holder.join(JOIN)
    t.join(JOIN)
    assert not alive, "the aborted branch stayed blocked after resolve"
    assert outcome["exc"].source == "losing_speculation"
    assert winner.committed and w.store == {"answer": 1} and w.log.count("book 1") == 1
