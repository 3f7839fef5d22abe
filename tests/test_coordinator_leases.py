"""Leases under load: a live member is never fenced because the machine is busy.

Eight processes on one hot key, with CPU burners beside them on the same cores: every
append queues behind the others, and every heartbeat thread competes for the CPU. The
heartbeats must still land (they take no append lock), and a member whose heartbeat is late
while it holds its durable log's lock must not be fenced (the lock proves it alive).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from coordinator_support import configs, pg_fixture, spawn, url_fixture, wait_all  # noqa: F401

from atomix.adapters.sqlite import SQLiteStore
from atomix.coordinator import open_store
from atomix.coordinator.members import log_held
from atomix.coordinator.store import Member
from atomix.log import TxLog

FULL = os.environ.get("ATOMIX_COORDINATOR_FULL") == "1"


def _burn(stop: float) -> None:
    while time.monotonic() < stop:
        pass


@pytest.fixture
def burners() -> Iterator[None]:
    """Two busy processes: the cores are overloaded while the test runs (bounded: they stop
    by themselves after two minutes, and are ended at teardown)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_burn, args=(time.monotonic() + 120,), daemon=True) for _ in range(2)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.join(10)


def _statuses(url: str) -> list[str]:
    store = open_store(url)
    try:
        return [m.status for m in store.members()]
    finally:
        store.close()


@pytest.mark.parametrize("logged", [False, True], ids=["heartbeats", "log-lock"])
def test_no_live_member_is_fenced_on_a_loaded_machine(
    url: str, tmp_path: Path, burners: None, logged: bool
) -> None:
    """8 processes read-modify-write one hot row and file on overloaded cores.

    heartbeats: a one-second lease, no durable log: only heartbeats keep the members live.
    log-lock: a lease far below the scheduling delays of a loaded machine (0.15 s), with a
    durable log: members are late all the time, and their held logs keep them from fencing.
    Either way every member finishes its work, none is fenced or recovered, no update is lost.
    """
    per = 40 if FULL else 12
    lease, beat = (0.15, 0.05) if logged else (1.0, 0.25)
    cfgs = configs(url, tmp_path, 8, workload="counter", commits=per, lease=lease, heartbeat=beat)
    if logged:
        for cfg in cfgs:
            cfg["log"] = str(tmp_path / f"log-{cfg['name']}")
    children = spawn(cfgs, tmp_path / "go")
    (tmp_path / "go").touch()
    results = wait_all(children, 600)  # a fenced child fails with Fenced: an AssertionError
    assert all(r is not None and r["committed"] == per for r in results), results
    assert _statuses(url) == ["left"] * 8
    store = SQLiteStore(tmp_path / "data" / "rows.db")
    try:
        assert store.get("t", "counter") == per * 8
    finally:
        store.close()


def test_log_held_tells_a_live_log_from_a_released_one(tmp_path: Path) -> None:
    """The proof of life: a log locked by a TxLog is held; once closed (or never made), not."""
    member = Member(1, "live", str(tmp_path / "log"), os.getpid(), "here")
    assert not log_held(member)  # no log there
    log = TxLog(tmp_path / "log")
    try:
        assert log_held(member)
    finally:
        log.close()
    assert not log_held(member)
    assert not log_held(Member(2, "live", None, 1, "here"))


def test_a_member_that_takes_long_to_join_keeps_its_lease(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Joining replays the whole log (and then recovers dead members), which can outlast a
    lease on a long log. The lease is renewed from registration on, so a survivor's recoverer
    never fences a member that is still joining."""
    from atomix import Runtime
    from atomix.coordinator import CoordinatorSettings
    from atomix.coordinator.replica import ReplicatedCore

    settings = CoordinatorSettings(url, lease=0.5, heartbeat=0.1)
    survivor = Runtime(coordinator=settings)
    join = ReplicatedCore.join

    def slow_join(self: ReplicatedCore, member: int) -> None:
        time.sleep(2.0)  # four leases: a long log to replay
        join(self, member)

    monkeypatch.setattr(ReplicatedCore, "join", slow_join)
    try:
        joiner = Runtime(coordinator=settings)
        monkeypatch.undo()
        try:
            assert joiner.membership is not None
            assert joiner.membership.member not in [
                m.id for m in survivor.membership.store.members() if m.status != "live"  # type: ignore[union-attr]
            ]
            with joiner.transaction() as tx:
                tx.read("name:x")
        finally:
            joiner.close()
    finally:
        survivor.close()
