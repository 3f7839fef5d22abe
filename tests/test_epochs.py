"""Tests of atomix.epochs: one totally ordered, strictly increasing epoch line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from atomix.epochs import EpochAllocator
from atomix.manager import TransactionManager


def test_first_epoch_is_one_by_default() -> None:
    alloc = EpochAllocator()
    assert alloc.next == 1
    assert alloc.allocate() == 1
    assert alloc.next == 2


@given(start=st.integers(min_value=-1000, max_value=1000), n=st.integers(min_value=1, max_value=200))
def test_epochs_strictly_increase(start: int, n: int) -> None:
    alloc = EpochAllocator(start)
    seen = []
    for _ in range(n):
        announced = alloc.next
        epoch = alloc.allocate()
        assert epoch == announced  # `next` says what `allocate` returns
        seen.append(epoch)
    assert seen[0] == start
    assert all(a < b for a, b in zip(seen, seen[1:], strict=False))
    assert len(set(seen)) == n


def test_next_does_not_allocate() -> None:
    alloc = EpochAllocator(5)
    assert alloc.next == 5
    assert alloc.next == 5
    assert alloc.allocate() == 5


def test_allocators_are_independent() -> None:
    a, b = EpochAllocator(), EpochAllocator()
    a.allocate()
    a.allocate()
    assert b.allocate() == 1
    assert a.allocate() == 3


@given(st.lists(st.sampled_from([None, "g1", "g2"]), min_size=1, max_size=30))
def test_manager_begin_hands_out_strictly_increasing_epochs(groups: list[str | None]) -> None:
    mgr = TransactionManager()
    epochs = [mgr.begin(group=g).epoch for g in groups]
    assert all(a < b for a, b in zip(epochs, epochs[1:], strict=False))


def test_a_retry_gets_a_fresh_larger_epoch() -> None:
    mgr = TransactionManager()
    first = mgr.begin()
    other = mgr.begin()
    mgr.abort(first.txid, "stale_read")
    mgr.finish(first.txid)
    retry = mgr.begin(trace=first.trace)
    assert retry.trace == first.trace
    assert retry.epoch > other.epoch > first.epoch
