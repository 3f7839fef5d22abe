"""Tests of atomix.frontier.ScopeIndex: registration over the scope trie, and commit stamps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from atomix.frontier import ScopeIndex
from atomix.scope_parsing import parse_scope
from atomix.scopes import Scope
from atomix.transaction import Transaction

TABLE = parse_scope("kv:t")
ROW1 = parse_scope("kv:t:1")
ROW2 = parse_scope("kv:t:2")
OTHER = parse_scope("kv:u:1")
REPO = parse_scope("fs:/repo")
SRC = parse_scope("fs:/repo/src")
APP = parse_scope("fs:/repo/src/app.py")
README = parse_scope("fs:/repo/README.md")
REPO2 = parse_scope("fs:/repo2/src/app.py")

ALL = [TABLE, ROW1, ROW2, OTHER, REPO, SRC, APP, README, REPO2, parse_scope("kv:t:1:x")]


def tx(txid: int, epoch: int | None = None) -> Transaction:
    return Transaction(txid=txid, epoch=txid if epoch is None else epoch, trace=f"t{txid}")


def holders(index: ScopeIndex, scope: Scope) -> set[int]:
    return {t.txid for t in index.overlapping_holders(scope)}


def eager(index: ScopeIndex, scope: Scope) -> set[int]:
    return {t.txid for t in index.overlapping_eager(scope)}


# --------------------------------------------------------------------------- registration


def test_empty_index_has_no_holders_and_zero_stamps() -> None:
    index = ScopeIndex()
    for scope in ALL:
        assert holders(index, scope) == set()
        assert eager(index, scope) == set()
        assert index.frontier(scope) == 0
        assert index.last_write_seq(scope) == 0
        assert index.last_write_epoch(scope) == 0


def test_a_table_meets_its_rows_and_rows_do_not_meet_each_other() -> None:
    index = ScopeIndex()
    index.register(ROW1, tx(1))
    assert holders(index, TABLE) == {1}  # table query sees a row holder (descendant)
    assert holders(index, ROW1) == {1}
    assert holders(index, ROW2) == set()  # a sibling row does not conflict
    assert holders(index, OTHER) == set()
    index.register(TABLE, tx(2))
    assert holders(index, ROW2) == {2}  # a row query sees the table holder (ancestor)
    assert holders(index, ROW1) == {1, 2}
    assert holders(index, parse_scope("kv:t:1:x")) == {1, 2}  # below a held row
    assert holders(index, OTHER) == set()


def test_a_directory_meets_its_files() -> None:
    index = ScopeIndex()
    index.register(APP, tx(1))
    index.register(README, tx(2))
    assert holders(index, REPO) == {1, 2}
    assert holders(index, SRC) == {1}
    assert holders(index, APP) == {1}
    assert holders(index, README) == {2}
    assert holders(index, REPO2) == set()  # a name prefix is not a path prefix
    assert holders(index, parse_scope("fs:/")) == {1, 2}  # the root covers everything
    index.register(SRC, tx(3))
    assert holders(index, APP) == {1, 3}
    assert holders(index, README) == {2}


def test_unregister_removes_and_prunes() -> None:
    index = ScopeIndex()
    a, b = tx(1), tx(2)
    index.register(ROW1, a)
    index.register(ROW1, a)  # idempotent
    index.register(ROW2, b)
    index.unregister(ROW1, a)
    assert holders(index, TABLE) == {2}
    assert holders(index, ROW1) == set()
    index.unregister(ROW2, b)
    assert holders(index, TABLE) == set()
    index.unregister(ROW2, b)  # twice: no effect
    index.unregister(parse_scope("kv:never:seen"), b)  # unknown scope: no effect
    assert holders(index, TABLE) == set()
    index.register(ROW2, b)
    assert holders(index, TABLE) == {2}


def test_same_tx_on_two_scopes_is_unregistered_per_scope() -> None:
    index = ScopeIndex()
    a = tx(1)
    index.register(ROW1, a)
    index.register(ROW2, a)
    index.unregister(ROW1, a)
    assert holders(index, TABLE) == {1}
    assert holders(index, ROW1) == set()
    assert holders(index, ROW2) == {1}


def test_eager_registrations_are_reported_separately() -> None:
    index = ScopeIndex()
    index.register(ROW1, tx(1))
    index.register(ROW2, tx(2), eager=True)
    assert eager(index, TABLE) == {2}
    assert eager(index, ROW1) == set()
    assert eager(index, ROW2) == {2}
    assert holders(index, TABLE) == {1, 2}
    index.register(TABLE, tx(3), eager=True)
    assert eager(index, ROW1) == {3}
    index.unregister(ROW2, tx(2))
    assert eager(index, ROW2) == {3}
    assert eager(index, TABLE) == {3}


# --------------------------------------------------------------------------- stamps


def test_frontier_covers_ancestors_and_descendants() -> None:
    index = ScopeIndex()
    index.stamp(ROW1, 5, write=False)
    assert index.frontier(ROW1) == 5
    assert index.frontier(TABLE) == 5  # a descendant's stamp reaches the table
    assert index.frontier(parse_scope("kv:t:1:x")) == 5  # and below the row
    assert index.frontier(ROW2) == 0  # not a sibling row
    assert index.frontier(OTHER) == 0
    index.stamp(TABLE, 3, write=False)
    assert index.frontier(ROW2) == 3  # an ancestor's stamp reaches every row
    assert index.frontier(ROW1) == 5
    assert index.frontier(parse_scope("kv:t:9")) == 3  # a row never touched


def test_read_stamps_do_not_count_as_writes() -> None:
    index = ScopeIndex()
    index.stamp(ROW1, 9, write=False)
    assert index.frontier(ROW1) == 9
    assert index.last_write_epoch(ROW1) == 0
    assert index.last_write_seq(ROW1) == 0
    index.stamp(ROW1, 4, write=True, visible_seq=11)
    assert index.frontier(ROW1) == 9
    assert index.last_write_epoch(ROW1) == 4
    assert index.last_write_seq(ROW1) == 11


def test_last_write_seq_across_ancestors_and_descendants() -> None:
    index = ScopeIndex()
    index.stamp(APP, 2, write=True, visible_seq=10)
    assert index.last_write_seq(APP) == 10
    assert index.last_write_seq(SRC) == 10  # a directory sees a write to its file
    assert index.last_write_seq(REPO) == 10
    assert index.last_write_seq(README) == 0
    assert index.last_write_seq(REPO2) == 0
    index.stamp(REPO, 1, write=True, visible_seq=20)
    assert index.last_write_seq(README) == 20  # a file sees a write to its directory
    assert index.last_write_seq(APP) == 20
    assert index.last_write_seq(REPO2) == 0
    assert index.last_write_epoch(README) == 1
    assert index.last_write_epoch(APP) == 2


def test_stamps_never_regress() -> None:
    index = ScopeIndex()
    index.stamp(ROW1, 7, write=True, visible_seq=30)
    index.stamp(ROW1, 3, write=True, visible_seq=12)  # older news
    assert index.frontier(ROW1) == 7
    assert index.last_write_epoch(ROW1) == 7
    assert index.last_write_seq(ROW1) == 30
    assert index.frontier(TABLE) == 7


def test_stamps_and_registrations_are_independent() -> None:
    index = ScopeIndex()
    index.register(ROW1, tx(1))
    index.stamp(ROW2, 4, write=True, visible_seq=3)
    assert holders(index, TABLE) == {1}
    index.unregister(ROW1, tx(1))
    assert index.frontier(TABLE) == 4  # unregistering never lowers a frontier


# --------------------------------------------------------------------------- properties

SCOPES = st.sampled_from(ALL)


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(1, 5), SCOPES, st.booleans()), max_size=40
    )
)
def test_holders_match_a_brute_force_overlap_model(ops: list[tuple[bool, int, Scope, bool]]) -> None:
    index = ScopeIndex()
    txs = {i: tx(i) for i in range(1, 6)}
    held: set[tuple[int, Scope]] = set()
    eager_held: set[tuple[int, Scope]] = set()
    for add, txid, scope, is_eager in ops:
        if add:
            index.register(scope, txs[txid], eager=is_eager)
            held.add((txid, scope))
            if is_eager:
                eager_held.add((txid, scope))
        else:
            index.unregister(scope, txs[txid])
            held.discard((txid, scope))
            eager_held.discard((txid, scope))
        for q in ALL:
            assert holders(index, q) == {t for t, s in held if s.overlaps(q)}
            assert eager(index, q) == {t for t, s in eager_held if s.overlaps(q)}


@given(
    st.lists(
        st.tuples(SCOPES, st.integers(0, 50), st.booleans(), st.integers(0, 100)), max_size=40
    )
)
def test_stamps_are_maxima_over_overlapping_scopes_and_monotone(
    ops: list[tuple[Scope, int, bool, int]],
) -> None:
    index = ScopeIndex()
    stamps: list[tuple[Scope, int, bool, int]] = []
    last = {q: (0, 0, 0) for q in ALL}
    for scope, epoch, write, seq in ops:
        index.stamp(scope, epoch, write=write, visible_seq=seq)
        stamps.append((scope, epoch, write, seq))
        for q in ALL:
            over = [s for s in stamps if s[0].overlaps(q)]
            expect = (
                max((e for _, e, _, _ in over), default=0),
                max((e for _, e, w, _ in over if w), default=0),
                max((v for _, _, w, v in over if w), default=0),
            )
            got = (index.frontier(q), index.last_write_epoch(q), index.last_write_seq(q))
            assert got == expect
            assert all(g >= p for g, p in zip(got, last[q], strict=True))  # monotone
            last[q] = got
