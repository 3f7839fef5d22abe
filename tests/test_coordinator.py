"""The multi-process coordinator, against a real PostgreSQL server and a SQLite file.

Every case runs on both coordinators. Sizes are small by default; ``ATOMIX_COORDINATOR_FULL=1``
runs the full sizes (300 committed transactions per lost-update run, longer histories).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from coordinator_support import (  # noqa: F401 - the pg and url fixtures
    check,
    final_lists,
    load_history,
    pg_fixture,
    spawn,
    url_fixture,
    wait_all,
)
from coordinator_support import configs as _configs

from atomix import Runtime
from atomix.adapters.sqlite import SQLiteStore
from atomix.adapters.tools import sqlite_tools
from atomix.coordinator import CoordinatorError, CoordinatorSettings, Fenced, open_store

FULL = os.environ.get("ATOMIX_COORDINATOR_FULL") == "1"


@pytest.mark.parametrize("processes", [2, 4, 8])
def test_no_lost_update(url: str, tmp_path: Path, processes: int) -> None:
    """N processes, each its own Runtime on one coordinator, read-modify-write one SQLite row
    and one file: the final counts equal the committed transactions."""
    total = 300 if FULL else 48
    per = total // processes
    children = spawn(
        _configs(url, tmp_path, processes, workload="counter", commits=per), tmp_path / "go"
    )
    (tmp_path / "go").touch()
    results = wait_all(children, 600)
    committed = sum(r["committed"] for r in results if r)
    assert committed == per * processes
    store = SQLiteStore(tmp_path / "data" / "rows.db")
    row = store.get("t", "counter")
    store.close()
    text = (tmp_path / "data" / "files" / "counter.txt").read_text()
    assert (row, int(text)) == (committed, committed), f"lost: {committed - row} rows, {committed - int(text)} file"


def _append_run(url: str, tmp: Path, *, processes: int, keys: int, commits: int, seconds: float,
                log: bool = False, lease: float = 10.0, heartbeat: float | None = None,
                kill: int = 0, seed: int = 0) -> tuple[dict, list]:
    configs = _configs(url, tmp, processes, workload="append", keys=keys, commits=commits,
                       seconds=seconds, lease=lease, heartbeat=heartbeat, timeout=30.0)
    for cfg in configs:
        cfg["history"] = str(tmp / f"history-{cfg['name']}.jsonl")
        if log:
            cfg["log"] = str(tmp / f"log-{cfg['name']}")
    children = spawn(configs, tmp / "go")
    (tmp / "go").touch()
    rng = random.Random(seed)
    victims = rng.sample(range(len(children)), kill)
    for index in victims:
        # Killed mid-run, whatever the machine's speed: once it has acknowledged a commit
        # (so it holds work a survivor must take over), at a random moment soon after.
        history = Path(str(configs[index]["history"]))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and children[index].proc.poll() is None:
            if history.is_file() and '"ok"' in history.read_text(encoding="utf-8"):
                break
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.02))
        assert children[index].proc.poll() is None, (
            f"process {index} finished before its kill: give it more commits")
        children[index].proc.send_signal(signal.SIGKILL)
    results = wait_all(children, 600)
    txs = load_history([Path(str(c["history"])) for c in configs])
    verdict = check(txs, final_lists(tmp / "data" / "rows.db", keys))
    return {"verdict": verdict, "txs": txs}, results


def test_history_has_no_anomaly(url: str, tmp_path: Path) -> None:
    """8 processes, randomized list-append transactions over few keys: the Elle-style check
    finds no lost, duplicated or half-applied append, no bad read and no dependency cycle."""
    run, results = _append_run(
        url, tmp_path, processes=8, keys=3, commits=40 if FULL else 12, seconds=120, seed=1
    )
    verdict = run["verdict"]
    assert verdict.ok, verdict
    assert verdict.committed == sum(r["committed"] for r in results if r)
    assert verdict.edges["ww"] > 0 and verdict.edges["wr"] > 0  # the check had work to do


def test_killed_processes_are_recovered_by_survivors(url: str, tmp_path: Path) -> None:
    """SIGKILL processes at random mid-run: survivors take over their transactions after the
    lease, from their logs; nothing acknowledged is lost, nothing duplicated or half-applied,
    and the history has no anomaly."""
    run, results = _append_run(
        url, tmp_path, processes=8, keys=3, commits=80 if FULL else 30, seconds=120,
        log=True, lease=1.0, heartbeat=0.2, kill=3 if FULL else 2, seed=7,
    )
    verdict = run["verdict"]
    assert verdict.ok, verdict
    store = open_store(url)
    try:
        statuses = [m.status for m in store.members()]
    finally:
        store.close()
    assert statuses.count("recovered") >= 2, statuses  # killed ones were taken over
    assert sum(1 for r in results if r is not None) == len(results) - (3 if FULL else 2)


def test_fenced_process_is_refused(url: str, tmp_path: Path) -> None:
    """A process that stalls past its lease is fenced; a survivor settles its transaction;
    when the stalled process resumes, its write is refused with a clear error and never lands."""
    db_path = tmp_path / "rows.db"
    slow = Runtime(coordinator=CoordinatorSettings(url, lease=0.3, recover_others=False))
    fast = Runtime(coordinator=CoordinatorSettings(url, lease=0.3, recover_others=False))
    try:
        slow_db = sqlite_tools(slow, SQLiteStore(db_path))
        fast_db = sqlite_tools(fast, SQLiteStore(db_path))
        tx = slow.transaction()
        tx.__enter__()
        slow_db.put("t", "k", "late")
        assert slow.membership is not None and fast.membership is not None
        slow.membership._stop.set()  # the process stalls: no more heartbeats
        slow.membership._threads[1].join()
        time.sleep(0.6)
        recovered = fast.membership.recover_dead()
        assert [r.member for r in recovered] == [slow.membership.member]
        assert recovered[0].txids == [tx.txid]
        with fast.transaction():
            fast_db.put("t", "k", "fresh")  # the scope was released
        with pytest.raises(Fenced, match="refused"):
            tx.__exit__(None, None, None)
        assert SQLiteStore(db_path).get("t", "k") == "fresh"
    finally:
        fast.close()
        slow.close()  # allowed: the survivor settled its transaction


def test_checker_detects_anomalies() -> None:
    """The checker can fail: a lost update (two appends on one read), a write skew cycle."""
    txs = {
        "a": {"tid": "a", "status": "ok", "ops": [["r", 0, []], ["a", 0, "a.0"]]},
        "b": {"tid": "b", "status": "ok", "ops": [["r", 0, []], ["a", 0, "b.0"]]},
    }
    lost = check(txs, {"0": ["b.0"]})
    assert lost.lost == ["a.0"] and not lost.ok
    # Write skew: each reads the key the other appends to and sees nothing: rw both ways.
    skew = {
        "a": {"tid": "a", "status": "ok", "ops": [["r", 1, []], ["a", 0, "a.0"]]},
        "b": {"tid": "b", "status": "ok", "ops": [["r", 0, []], ["a", 1, "b.1"]]},
    }
    verdict = check(skew, {"0": ["a.0"], "1": ["b.1"]})
    assert verdict.cycles == [["a", "b"]]
    assert check(skew, {"0": ["a.0"], "1": ["b.1", "b.1"]}).duplicated == ["b.1"]


def test_bad_urls_and_mismatched_options(tmp_path: Path) -> None:
    with pytest.raises(CoordinatorError, match="allowed are"):
        Runtime(coordinator="mysql://x")
    with pytest.raises(CoordinatorError, match="does not exist"):
        Runtime(coordinator=f"sqlite://{tmp_path}/missing/c.db")
    with pytest.raises(ValueError, match="lease"):
        CoordinatorSettings("sqlite:///x", lease=0)
    from atomix.manager import RuntimeOptions

    url = f"sqlite://{tmp_path}/c.db"
    first = Runtime(coordinator=url)
    try:
        with pytest.raises(CoordinatorError, match="same"):
            Runtime(RuntimeOptions(abort_on_stale=False), coordinator=url)
    finally:
        first.close()


def test_epochs_and_waits_are_shared(url: str) -> None:
    """Two runtimes in one process, as two processes would be: epochs are one order, and a
    later transaction waits for an earlier one of the other runtime on the same scope."""
    a = Runtime(coordinator=url, timeout=5)
    b = Runtime(coordinator=url, timeout=5)
    try:
        ta = a.transaction()
        tb = b.transaction()
        assert tb.epoch == ta.epoch + 1 and tb.txid == ta.txid + 1
        ta.read("name:x")  # (no effect needed: a read registers the scope)

        done: list[float] = []

        def later() -> None:
            t0 = time.monotonic()
            from atomix.effects import BUFFERABLE, Effect

            tb.stage(Effect("w", BUFFERABLE, (b.core.scope("name:x"),), "k1", apply=lambda: None))
            tb.commit()
            done.append(time.monotonic() - t0)

        worker = threading.Thread(target=later)
        worker.start()
        time.sleep(0.3)
        assert not done  # tb waits for ta, an earlier reader of what it writes
        ta.commit()
        worker.join(5)
        assert done and done[0] >= 0.25
        settled = json.dumps([s.outcome for s in b.settlements])
        assert "committed" in settled
    finally:
        a.close()
        b.close()


def test_a_retry_claims_its_scopes_on_the_coordinator(url: str) -> None:
    """`Runtime.run` retries a stale abort after claiming the failed attempt's scopes
    (`reserve`): the claim is replicated like every other call."""
    a = Runtime(coordinator=url, timeout=5)
    b = Runtime(coordinator=url, timeout=5)
    try:
        store: dict[str, str] = {}

        @a.tool(effect="bufferable", reads="name:{k}", writes="name:{k}")
        def put_a(k: str, v: str) -> None:
            store[k] = v

        @b.tool(effect="bufferable", writes="name:{k}")
        def put_b(k: str, v: str) -> None:
            store[k] = v

        epochs: list[int] = []

        def body(tx: object) -> None:
            epochs.append(tx.epoch)  # type: ignore[attr-defined]
            if len(epochs) == 1:
                with b.transaction():  # a later epoch commits x first: this attempt is late
                    put_b("x", "b")
            put_a("x", "a")

        a.run(body)
        assert len(epochs) == 2 and epochs[1] > epochs[0]
        assert store == {"x": "a"}
        assert [s.outcome for s in a.settlements] == ["aborted", "committed"]
    finally:
        a.close()
        b.close()
