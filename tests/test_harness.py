"""The harness engine: determinism, parallel workers, resume after a kill, the oracle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, Stopwatch, proc_done, proc_state, wait_until

from atomix.adapters import Op
from harness.experiment.config import validate_config
from harness.experiment.runner import plan, read_records, run
from harness.experiment.trial import TrialSpec, run_trial
from harness.world import oracle
from harness.world.clock import Park, Sleep, VirtualClock
from harness.world.faults import FaultConfig


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "timings"}


def _config(trials: int = 4, **extra: object):
    data = {
        "name": "probe",
        "workload": "synthetic",
        "seed": 5,
        "trials": trials,
        "modes": ["tx-full", "no-tx"],
        "faults": {"classes": "mixed"},
        "grid": {"faults.rate": [0.0, 0.3]},
        **extra,
    }
    return validate_config(data, "probe.yaml")


# -- virtual clock ----------------------------------------------------------------------------
def test_virtual_clock_orders_events_and_times_out() -> None:
    clock = VirtualClock()
    signal_ = clock.signal()
    log: list[tuple[str, float, object]] = []

    async def sleeper() -> None:
        await Sleep(10)
        log.append(("slept", clock.now, None))
        woken = await Park(signal_, 100)
        log.append(("woken", clock.now, woken))

    async def setter() -> None:
        await Sleep(50)
        signal_.set()

    async def timed_out() -> None:
        woken = await Park(clock.signal(), 30)
        log.append(("timeout", clock.now, woken))

    for coro in (sleeper(), setter(), timed_out()):
        clock.spawn(coro)
    with Stopwatch() as took:  # (time spent waiting for a busy CPU aside)
        clock.run()
    assert log == [("slept", 10.0, None), ("timeout", 30.0, False), ("woken", 50.0, True)]
    assert took.seconds < 1.0  # simulated time costs no wall time
    assert not clock.stuck()


def test_sixty_four_agents_with_seconds_of_waiting_cost_little_wall_time() -> None:
    spec = TrialSpec(
        "probe", "tau_contention", "workflow-lock", "n=64", {}, 0, 1,
        params={"agents": 64, "contended": 2, "plan_delay_ms": [20, 120]},
    )
    with Stopwatch() as took:  # its wall time, less any wait for a busy CPU
        record = run_trial(spec)
    assert record["metrics"]["committed"] == 64
    assert record["metrics"]["makespan_ms"] > 1000  # seconds of simulated time
    assert took.seconds < 30


# -- determinism ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["tx-full", "no-tx", "saga", "occ"])
def test_same_seed_gives_identical_records(mode: str) -> None:
    spec = TrialSpec("probe", "synthetic", mode, "c", {}, 3, 9, faults=FaultConfig(rate=0.3))
    assert _strip(run_trial(spec)) == _strip(run_trial(spec))


def test_every_mode_sees_the_same_tasks_and_fault_stream() -> None:
    faults = FaultConfig(rate=0.3, classes="F1")
    a = run_trial(TrialSpec("probe", "synthetic", "no-tx", "c", {}, 2, 9, faults=faults))
    b = run_trial(TrialSpec("probe", "synthetic", "saga", "c", {}, 2, 9, faults=faults))
    # Direct-call modes make the same calls, so the same logical calls fault, until the first
    # attempt aborts: no-tx stops there, saga compensates and starts over (new calls, own draws).
    assert a["faults"] and a["faults"] == b["faults"][: len(a["faults"])]


def test_one_and_two_workers_give_identical_records(tmp_path: Path) -> None:
    config = _config()
    one = run(config, out=tmp_path / "one", jobs=1)
    two = run(config, out=tmp_path / "two", jobs=2)
    records_one = sorted((_strip(r) for r in read_records(one.records_path)), key=lambda r: r["key"])
    records_two = sorted((_strip(r) for r in read_records(two.records_path)), key=lambda r: r["key"])
    assert len(records_one) == len(plan(config)) == 16
    assert records_one == records_two


# -- resume -------------------------------------------------------------------------------------
def test_a_killed_run_resumes_to_exactly_the_full_set(tmp_path: Path) -> None:
    config_path = tmp_path / "probe.yaml"
    config_path.write_text(
        json.dumps(
            {
                "name": "probe", "workload": "synthetic", "seed": 5, "trials": 60,
                "modes": ["tx-full", "no-tx"], "grid": {"faults.rate": [0.1]},
            }
        )
    )
    # The run stops itself (SIGSTOP) once 10 records are on disk, so the kill cuts it there
    # however fast or slow the machine is.
    script = (
        "import os, signal, sys; from pathlib import Path; from harness.experiment.config import load_config; "
        "from harness.experiment.runner import run\n"
        "def progress(done, total, record):\n"
        "    if done >= 10: os.kill(os.getpid(), signal.SIGSTOP)\n"
        "run(load_config(sys.argv[1]), out=Path(sys.argv[2]), jobs=1, progress=progress)"
    )
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", script, str(config_path), str(out)], cwd=ROOT)
    try:
        wait_until(
            lambda: proc_state(proc.pid) == "T" or proc_done(proc.pid), "the run wrote 10 records"
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    found = list(out.glob("probe/*/trials.jsonl"))
    records = found[0] if found else None
    assert records is not None, "the run wrote nothing before it ended"
    with open(records, "a") as fh:  # a record torn by the kill
        fh.write('{"key": "probe/tx-full/fp=0.1/59", "trunc')
    before = len(read_records(records))
    assert 10 <= before < 120
    from harness.experiment.config import load_config

    result = run(load_config(config_path), resume=records.parent)
    keys = [r["key"] for r in read_records(records)]
    assert len(keys) == len(set(keys)) == 120
    assert set(keys) == {s.key for s in plan(load_config(config_path))}
    assert result.skipped == before and result.ran == 120 - before
    manifest = json.loads((records.parent / "manifest.json").read_text())
    assert manifest["status"] == "complete"


# -- the oracle -------------------------------------------------------------------------------
def _op(seq: int, scope: str, kind: str, agent: str = "a0", attempt: int = 1, **meta: object) -> Op:
    return Op(seq, "db", scope, kind, None, {"agent": agent, "attempt": attempt, **meta})


def test_oracle_catches_a_planted_duplicate() -> None:
    ops = [_op(1, "db:x", "write", op="a0/t/1"), _op(2, "db:x", "write", op="a0/t/1")]
    assert oracle.duplicates(ops) == 1
    undone = [*ops, _op(3, "db:x", "write", op="a0/t/1", undo=True)]
    assert oracle.duplicates(undone) == 0
    idem = [_op(1, "db:x", "write", op="a0/t/1", idem=True)] * 2
    assert oracle.duplicates(idem) == 0


def test_oracle_catches_a_planted_leak() -> None:
    messages = [{"to": "a@x", "meta": {"agent": "a0", "attempt": 1}}]
    assert oracle.leaks(messages, committed={("a0", 1)}) == 0
    assert oracle.leaks(messages, committed={("a0", 2)}) == 1


def test_oracle_catches_a_planted_stale_write() -> None:
    # a0 reads x, a1 writes x, then a0 writes x from what it read: a lost update.
    ops = [
        _op(1, "db:x", "read", "a0"),
        _op(2, "db:x", "write", "a1"),
        _op(3, "db:x", "write", "a0"),
    ]
    committed = {("a0", 1), ("a1", 1)}
    assert oracle.stale_commits(ops, committed) == 1
    assert oracle.stale_commits(ops, {("a0", 1)}) == 0  # the other write never committed


def test_oracle_catches_a_planted_serialisability_cycle() -> None:
    ops = [
        _op(1, "db:x", "read", "a0"),
        _op(2, "db:y", "read", "a1"),
        _op(3, "db:x", "write", "a1"),
        _op(4, "db:y", "write", "a0"),
    ]
    committed = {("a0", 1), ("a1", 1)}
    assert oracle.has_cycle(oracle.conflict_edges(ops, committed))
    serial = [
        _op(1, "db:x", "read", "a0"),
        _op(2, "db:y", "write", "a0"),
        _op(3, "db:y", "read", "a1"),
        _op(4, "db:x", "write", "a1"),
    ]
    assert not oracle.has_cycle(oracle.conflict_edges(serial, committed))
    # Overlap, not equality: a table write conflicts with a row read.
    hier = [_op(1, "db:t:1", "read", "a0"), _op(2, "db:t", "write", "a1"), _op(3, "db:t:2", "write", "a0")]
    hier.append(_op(4, "db:t:1", "read", "a1"))
    assert oracle.has_cycle(oracle.conflict_edges(hier, committed))


def test_oracle_verdict_clean_definition() -> None:
    verdict = oracle.judge(final={"a": 1}, expected={"a": 1}, ops=[], messages=[], committed=set())
    assert verdict.clean
    assert not oracle.judge(final={"a": 2}, expected={"a": 1}, ops=[], messages=[], committed=set()).clean
    residue_ops = [_op(1, "db:x", "write", op="a0/t/0")]
    unreported = oracle.judge(final={}, expected={}, ops=residue_ops, messages=[], committed=set())
    assert unreported.residue == 1 and unreported.unclassified_residue == 1 and not unreported.clean
    reported = oracle.judge(
        final={}, expected={}, ops=residue_ops, messages=[], committed=set(), reported_residue=1
    )
    assert reported.unclassified_residue == 0


# -- the modes under each fault class on the synthetic workload ------------------------------------
@pytest.mark.parametrize("fault", ["F2", "F4"])
def test_tx_full_deduplicates_where_no_tx_duplicates(fault: str) -> None:
    faults = FaultConfig(rate=0.5, classes=fault)
    dup = {"tx-full": 0, "no-tx": 0}
    for mode in dup:
        for trial in range(10):
            record = run_trial(TrialSpec("probe", "synthetic", mode, fault, {}, trial, 3, faults=faults))
            dup[mode] += record["metrics"]["duplicates"]
    assert dup["tx-full"] == 0
    assert dup["no-tx"] > 0
