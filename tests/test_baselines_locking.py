"""The locking and optimistic baselines (workflow-lock, per-call-lock, mutex-wal, occ) and the
virtual-clock lock manager, each shown doing what defines it on real substrates, with
several agents on one VirtualClock."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from atomix.effects import AbortSource, EffectClass
from atomix.scope_parsing import parse_scope
from baselines.mutex_wal import _decode
from baselines.occ import VersionTable
from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task, run_agent
from harness.experiment.trial import TrialSpec, run_trial
from harness.modes.base import Aborted, AgentContext, ModeSettings, TrialMode
from harness.modes.locks import LockManager
from harness.modes.registry import get_mode
from harness.world import faults
from harness.world.boundary import Boundary
from harness.world.clock import Sleep, VirtualClock
from harness.world.oracle import judge, leaks, stale_commits
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolCall, ToolDef, ToolError

MODES = ("workflow-lock", "per-call-lock", "mutex-wal", "occ")
LATENCY = 5.0
STEP = 20.0  # plan delay before each step (simulated ms)


# --------------------------------------------------------------------------- tiny scenario
def _none(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return []


def _row(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.db.scope("counters", a["k"])]


def _get(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    return env.db.get("counters", a["k"], log_read=True, meta=d.meta)


def _put(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.db.put("counters", a["k"], a["value"], key=d.key, meta=d.meta)


def _before(env: TrialEnv, a: dict[str, Any]) -> Any:
    return env.db.get("counters", a["k"])


def _undo(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    if before is None:
        env.db.delete("counters", a["k"], key=d.key, meta=d.meta)
    else:
        env.db.put("counters", a["k"], before, key=d.key, meta=d.meta)


def _mail(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.mailbox.scope(a["to"])]


def _send(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.mailbox.send(a["to"], "note", a["body"], key=d.key, meta=d.meta)


def _refuse(env: TrialEnv, a: dict[str, Any], d: Delivery) -> None:
    raise ToolError("refused")


TOOLS: dict[str, ToolDef] = {
    t.name: t
    for t in (
        ToolDef("get", None, _row, _none, _get),
        ToolDef("put", EffectClass.BUFFERABLE, _none, _row, _put, _before, _undo, idempotent=True),
        ToolDef("send", EffectClass.IRREVERSIBLE, _none, _mail, _send),
        ToolDef("refuse", None, _none, _none, _refuse),
    )
}


def incr(task_id: str, k: int = 1) -> Task:
    """Read-modify-write in two calls: read the counter, write what was read plus one."""
    return Task(
        task_id,
        (
            Step("get", {"k": k}, save_as="c"),
            Step("put", lambda m, k=k: {"k": k, "value": m["c"] + 1}),
        ),
    )


@dataclass
class Run:
    env: TrialEnv
    clock: VirtualClock
    trial: TrialMode
    outcomes: dict[str, AgentOutcome]

    def counter(self, k: int = 1) -> Any:
        return self.env.db.get("counters", k)

    def committed(self) -> set[tuple[str, int]]:
        return {
            (o.agent, o.committed_attempt)
            for o in self.outcomes.values()
            if o.committed_attempt is not None
        }


@pytest.fixture
def env(tmp_path: Path) -> Iterator[TrialEnv]:
    e = TrialEnv.create(tmp_path)
    e.db.put("counters", 1, 0)
    e.db.put("counters", 2, 0)
    yield e
    e.close()


def run(
    env: TrialEnv,
    mode: str,
    tasks: Sequence[Task],
    offsets: Sequence[float],
    *,
    settings: ModeSettings | None = None,
    policy: AgentPolicy | None = None,
    injector: faults.FaultInjector | None = None,
) -> Run:
    """Run one agent per task under `mode` on one virtual clock, as `run_trial` does."""
    settings = settings or ModeSettings()
    policy = policy or AgentPolicy(plan_delay_ms=(STEP, STEP))
    clock = VirtualClock()
    trial = get_mode(mode).factory(env, clock, settings)
    outcomes: dict[str, AgentOutcome] = {}
    for i, (task, offset) in enumerate(zip(tasks, offsets, strict=True)):
        agent = f"a{i}"
        boundary = Boundary(
            clock, injector, latency_ms=LATENCY, jitter_ms=0.0, rng=random.Random(i)
        )

        def make_ctx(
            attempt: int, agent: str = agent, boundary: Boundary = boundary
        ) -> AgentContext:
            return AgentContext(
                agent, attempt, f"test/{agent}/{attempt}", env, clock, boundary, settings
            )

        async def main(
            make_ctx: Any = make_ctx,
            task: Task = task,
            offset: float = offset,
            agent: str = agent,
            seed: int = i,
        ) -> None:
            await Sleep(offset)
            outcomes[agent] = await run_agent(
                trial, make_ctx, task, TOOLS, policy, random.Random(seed)
            )

        clock.spawn(main(), agent)
    clock.run()
    assert not clock.stuck()
    return Run(env, clock, trial, outcomes)


def session(env: TrialEnv, mode: str, **settings: Any) -> tuple[Any, AgentContext]:
    """One bare session of `mode` (for driving begin/call/abort by hand)."""
    clock = VirtualClock()
    trial = get_mode(mode).factory(env, clock, ModeSettings(**settings))
    boundary = Boundary(clock, None, latency_ms=LATENCY, jitter_ms=0.0, rng=random.Random(0))
    ctx = AgentContext("a0", 1, "test/a0/1", env, clock, boundary, ModeSettings(**settings))
    return trial.session(ctx), ctx


def drive(clock: VirtualClock, coro: Any) -> Any:
    task = clock.spawn(coro)
    clock.run()
    if task.error is not None:
        raise task.error
    return task.result


# --------------------------------------------------------------------------- lock manager
def _ctx(clock: VirtualClock, name: str, timeout: float = 1_000.0) -> AgentContext:
    boundary = Boundary(clock, None, latency_ms=0.0, jitter_ms=0.0, rng=random.Random(0))
    # The lock manager never touches the substrates, so this context has none.
    no_env: Any = None
    return AgentContext(name, 1, name, no_env, clock, boundary, ModeSettings(timeout_ms=timeout))


def test_lock_manager_overlap_fifo_reentrancy_and_atomicity() -> None:
    clock = VirtualClock()
    locks = LockManager(clock)
    grants: list[tuple[str, float]] = []

    async def hold(
        name: str, scopes: list[str], start: float, ms: float, more: Sequence[str] = ()
    ) -> None:
        ctx = _ctx(clock, name)
        await Sleep(start)
        await locks.acquire(ctx, scopes)
        grants.append((name, clock.now))
        if more:
            # Re-entrant: a scope the owner already covers (a row of its table) is free.
            before = clock.now
            await locks.acquire(ctx, more)
            assert clock.now == before
        await Sleep(ms)
        locks.release(name)

    clock.spawn(hold("A", ["app:orders"], 0, 100, more=["app:orders:7"]))
    clock.spawn(hold("B", ["app:orders:7", "app:users:1"], 10, 50))  # the row is in A's table
    clock.spawn(hold("C", ["app:users:1"], 20, 10))  # free now, but B asked first
    clock.spawn(hold("D", ["app:stock:3"], 30, 10))  # disjoint from everyone
    clock.run()
    assert dict(grants) == {"A": 0, "D": 30, "B": 100, "C": 150}
    assert locks.waiting() == 0 and all(not locks.held(o) for o in "ABCD")


def test_lock_wait_times_out_into_a_retryable_abort() -> None:
    clock = VirtualClock()
    locks = LockManager(clock)
    seen: dict[str, Any] = {}

    async def a() -> None:
        await locks.acquire(_ctx(clock, "A"), ["app:x"])
        await Sleep(100)
        locks.release("A")

    async def b() -> None:
        await Sleep(1)
        ctx = _ctx(clock, "B", timeout=30)
        try:
            await locks.acquire(ctx, ["app:x", "app:y"])
        except Aborted as exc:
            seen["exc"], seen["at"], seen["blocked"] = exc, clock.now, ctx.blocked_ms

    async def c() -> None:
        await Sleep(2)
        await locks.acquire(_ctx(clock, "C"), ["app:y"])  # queued behind B until B withdraws
        seen["c"] = clock.now

    for coro in (a(), b(), c()):
        clock.spawn(coro)
    clock.run()
    exc = seen["exc"]
    assert exc.source is AbortSource.TIMEOUT and exc.retryable
    assert seen["at"] == 31 and seen["blocked"] == 30
    assert seen["c"] == 31  # B's withdrawn request no longer holds C back
    assert locks.stats.timeouts == 1


# --------------------------------------------------------------------------- workflow-lock
def _long_task(task_id: str, k: int) -> Task:
    return Task(
        task_id,
        (
            Step("get", {"k": k}),
            Step("put", {"k": k, "value": 5}),
            Step("get", {"k": k}),
            Step("put", {"k": k, "value": 6}),
        ),
    )


def test_workflow_lock_holds_the_footprint_for_the_whole_workflow(env: TrialEnv) -> None:
    tasks = [_long_task("t0", 1), _long_task("t1", 1)]
    locked = run(env, "workflow-lock", tasks, [0, 1])
    a0, a1 = locked.outcomes["a0"], locked.outcomes["a1"]
    duration = 4 * (STEP + LATENCY)
    assert a0.committed and a1.committed
    assert a0.blocked_ms == 0
    # The second agent waits from its begin (t=1) until the first commits (t=100).
    assert a1.blocked_ms == pytest.approx(duration - 1)


def test_workflow_lock_disjoint_footprints_do_not_wait(env: TrialEnv) -> None:
    free = run(env, "workflow-lock", [_long_task("t0", 1), _long_task("t1", 2)], [0, 1])
    assert all(o.committed and o.blocked_ms == 0 for o in free.outcomes.values())


def test_per_call_lock_waits_only_for_one_call(env: TrialEnv) -> None:
    percall = run(env, "per-call-lock", [_long_task("t0", 1), _long_task("t1", 1)], [0, 1])
    a1 = percall.outcomes["a1"]
    assert percall.outcomes["a0"].committed and a1.committed
    # At most one call's latency per step, never the other workflow's whole duration.
    assert 0 < a1.blocked_ms <= 4 * LATENCY


def test_workflow_lock_locks_an_undeclared_scope_on_the_spot(env: TrialEnv) -> None:
    sess, ctx = session(env, "workflow-lock")
    ctx.extra["declared_scopes"] = [env.db.scope("counters", 1)]
    locks: LockManager = sess.trial.locks

    async def go() -> None:
        await sess.begin()
        await sess.call(ToolCall(TOOLS["put"], {"k": 2, "value": 9}, "a0/t/0"))
        assert {str(s) for s in locks.held(ctx.trace)} == {
            env.db.scope("counters", 1),
            env.db.scope("counters", 2),
        }
        await sess.commit()

    drive(ctx.clock, go())
    assert not locks.held(ctx.trace)


def test_workflow_lock_gives_isolation_not_atomicity(env: TrialEnv) -> None:
    task = Task("t0", (Step("put", {"k": 1, "value": 7}), Step("refuse", {})))
    r = run(env, "workflow-lock", [task], [0])
    assert not r.outcomes["a0"].committed
    assert r.counter() == 7  # the partial effect stays: nothing rolls it back
    assert not r.trial.locks.held("test/a0/1")  # type: ignore[attr-defined]


def test_workflow_lock_wait_times_out_and_the_agent_retries(env: TrialEnv) -> None:
    r = run(
        env,
        "workflow-lock",
        [_long_task("t0", 1), _long_task("t1", 1)],
        [0, 1],
        settings=ModeSettings(timeout_ms=30),
    )
    a1 = r.outcomes["a1"]
    assert AbortSource.TIMEOUT.value in a1.aborts
    assert a1.committed and a1.attempts > 1
    assert r.trial.locks.stats.timeouts == len(a1.aborts)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- lost updates
def test_per_call_lock_loses_an_update_between_calls(env: TrialEnv) -> None:
    r = run(env, "per-call-lock", [incr("t0"), incr("t1")], [0, 10])
    assert all(o.committed for o in r.outcomes.values())
    assert r.counter() == 1  # +1, not +2: the second write was computed from a stale read
    assert stale_commits(env.oplog.ops(), r.committed()) == 1


def test_workflow_lock_does_not_lose_the_update(env: TrialEnv) -> None:
    # The computed write has no static scope: the footprint declares it.
    tasks = [
        Task(t.task_id, t.steps, footprint=(env.db.scope("counters", 1),))
        for t in (incr("t0"), incr("t1"))
    ]
    r = run(env, "workflow-lock", tasks, [0, 10])
    assert r.counter() == 2
    assert stale_commits(env.oplog.ops(), r.committed()) == 0


def test_occ_detects_the_stale_read_rolls_back_and_retries(env: TrialEnv) -> None:
    r = run(env, "occ", [incr("t0"), incr("t1")], [0, 10])
    a0, a1 = r.outcomes["a0"], r.outcomes["a1"]
    assert a0.committed and a1.committed
    assert a1.aborts == [AbortSource.STALE_READ.value] and a1.committed_attempt == 2
    assert r.counter() == 2
    ops = env.oplog.ops()
    assert any(op.meta.get("undo") and op.meta.get("agent") == "a1" for op in ops)
    verdict = judge(
        final={}, expected=None, ops=ops, messages=env.mailbox.messages(), committed=r.committed()
    )
    assert verdict.stale_commits == 0 and verdict.residue == 0 and verdict.serialisable


def test_occ_versions_follow_scope_overlap() -> None:
    table, row, other = (parse_scope(s) for s in ("app:orders", "app:orders:7", "app:users:1"))
    versions = VersionTable()
    seen_row = versions.version(row)
    seen_table = versions.version(table)
    versions.bump(table, "T")
    assert versions.writers_since(row, seen_row, "me") == ["T"]  # a table write hits its rows
    seen_table = versions.version(table)
    versions.bump(row, "U")
    assert versions.writers_since(table, seen_table, "me") == ["U"]  # and vice versa
    assert versions.writers_since(other, 0, "me") == []
    assert versions.writers_since(row, seen_row, "T") == ["U"]  # own writes do not count


def test_occ_eager_send_leaks_after_a_stale_read_abort(env: TrialEnv) -> None:
    notify = Task(
        "t1",
        (
            Step("get", {"k": 1}, save_as="c"),
            Step("send", {"to": "bob@example.com", "body": "counter seen"}),
            Step("put", lambda m: {"k": 1, "value": m["c"] + 1}),
        ),
    )
    r = run(env, "occ", [incr("t0"), notify], [0, 10])
    a1 = r.outcomes["a1"]
    assert AbortSource.STALE_READ.value in a1.aborts and a1.committed
    messages = env.mailbox.messages()
    sent_by = [(m["meta"]["agent"], m["meta"]["attempt"]) for m in messages]
    assert ("a1", 1) in sent_by  # the aborted attempt's message is still in the mailbox
    assert leaks(messages, r.committed()) >= 1
    assert r.counter() == 2  # the revocable write itself was rolled back and redone


def test_occ_known_failure_interleaved_eager_writes_roll_back_onto_each_other(
    env: TrialEnv,
) -> None:
    # Both write before either validates: each sees the other's (uncommitted) version bump,
    # both abort, and the second rollback restores the first one's aborted value.
    r = run(
        env,
        "occ",
        [incr("t0"), incr("t1")],
        [0, 1],
        policy=AgentPolicy(plan_delay_ms=(STEP, STEP), max_attempts=1),
    )
    assert not any(o.committed for o in r.outcomes.values())
    assert all(o.aborts == [AbortSource.STALE_READ.value] for o in r.outcomes.values())
    assert r.counter() == 1  # neither committed, yet the counter moved


# --------------------------------------------------------------------------- mutex-wal
def _wal_records(env: TrialEnv) -> list[dict[str, Any]]:
    files = sorted((env.workdir / "mutex-wal").glob("*.jsonl"))
    assert files, "no WAL file was written"
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def test_mutex_wal_rolls_back_from_the_wal_file_and_never_sends(env: TrialEnv) -> None:
    task = Task(
        "t0",
        (
            Step("put", {"k": 1, "value": 41}),
            Step("send", {"to": "bob@example.com", "body": "done"}),
            Step("put", {"k": 1, "value": 42}),
            Step("refuse", {}),  # the tool refuses: the step fails, the agent aborts
        ),
    )
    r = run(env, "mutex-wal", [task], [0])
    assert not r.outcomes["a0"].committed
    assert r.counter() == 0  # both writes restored, newest first
    assert env.mailbox.messages() == []  # the gated send never left
    records = _wal_records(env)
    befores = [rec for rec in records if rec["type"] == "before"]
    assert [_decode(rec["before"]) for rec in befores] == [0, 41]
    assert [rec["type"] for rec in records][-1] == "abort"
    undos = [op for op in env.oplog.ops() if op.meta.get("undo")]
    assert len(undos) == 2


def test_mutex_wal_restores_what_the_wal_file_says(env: TrialEnv) -> None:
    sess, ctx = session(env, "mutex-wal")

    async def go() -> None:
        await sess.begin()
        await sess.call(ToolCall(TOOLS["put"], {"k": 1, "value": 41}, "a0/t/0"))
        # The rollback reads the file, not a memory copy: rewrite the logged image.
        path = sess.wal.path
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        lines[0]["before"] = 17
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        await sess.abort(AbortSource.PRE_COMMIT_VETO)

    drive(ctx.clock, go())
    assert env.db.get("counters", 1) == 17


def test_mutex_wal_sends_gated_calls_only_at_commit(env: TrialEnv) -> None:
    task = Task(
        "t0",
        (
            Step("send", {"to": "bob@example.com", "body": "done"}),
            Step("put", {"k": 1, "value": 41}),
        ),
    )
    r = run(env, "mutex-wal", [task], [0])
    assert r.outcomes["a0"].committed
    ops = [op for op in env.oplog.ops() if op.meta.get("agent")]
    assert [op.kind for op in ops] == ["upsert", "append"]  # the send left after the write
    assert len(env.mailbox.messages()) == 1 and r.counter() == 41
    assert [rec["type"] for rec in _wal_records(env)][-2:] == ["commit", "sent"]


def test_mutex_wal_failed_rollback_is_reported_residue(env: TrialEnv) -> None:
    task = Task("t0", (Step("put", {"k": 1, "value": 41}), Step("refuse", {})))
    injector = faults.FaultInjector(
        faults.FaultConfig(rate=1.0, classes="F3"), seed=0, cell="c", trial=0
    )
    r = run(env, "mutex-wal", [task], [0], injector=injector)
    outcome = r.outcomes["a0"]
    assert r.counter() == 41 and outcome.reported_residue == 1
    verdict = judge(
        final={},
        expected=None,
        ops=env.oplog.ops(),
        messages=[],
        committed=r.committed(),
        reported_residue=outcome.reported_residue,
    )
    assert verdict.residue == 1 and verdict.unclassified_residue == 0


def test_mutex_wal_has_no_cross_workflow_isolation(env: TrialEnv) -> None:
    r = run(env, "mutex-wal", [incr("t0"), incr("t1")], [0, 10])
    assert r.counter() == 1  # the per-workflow mutex does not order different workflows
    assert all(o.blocked_ms == 0 for o in r.outcomes.values())


# --------------------------------------------------------------------------- smoke
def _spec(mode: str, trial: int, **kw: Any) -> TrialSpec:
    return TrialSpec(
        config="probe",
        workload="synthetic",
        mode=mode,
        cell_id="x",
        cell={},
        trial=trial,
        seed=1,
        **kw,
    )


@pytest.mark.parametrize("mode", MODES)
def test_synthetic_fp0_is_clean_and_deterministic(mode: str) -> None:
    for trial in range(6):
        first = run_trial(_spec(mode, trial))
        assert first["metrics"]["clean"], first["metrics"]
        assert first["metrics"]["stuck"] == 0
        again = run_trial(_spec(mode, trial))
        first.pop("timings")
        again.pop("timings")
        assert first == again


@pytest.mark.parametrize("mode", MODES)
def test_synthetic_multi_agent_faulted_runs_finish_deterministically(mode: str) -> None:
    spec = _spec(mode, 3, faults=faults.FaultConfig(rate=0.2), params={"agents": 4})
    first, again = run_trial(spec), run_trial(spec)
    assert first["metrics"]["stuck"] == 0
    first.pop("timings")
    again.pop("timings")
    assert first == again
