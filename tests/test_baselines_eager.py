"""Tests of the eager / reservation baselines: retry-only, saga, tcc, checkpoint-replay.

Each test drives a mode's session on real substrates (files on disk, a SQLite file, an
append-only mailbox file) through a fault boundary on the virtual clock, and judges the
outcome from the substrates and the op log, as the oracle does.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from atomix.effects import AbortSource
from atomix.tools import Ack
from harness.agents.task import AgentPolicy, Step, Task, run_agent
from harness.experiment.trial import TrialSpec, run_trial
from harness.modes.base import Aborted, AgentContext, ModeSession, ModeSettings, TrialMode
from harness.modes.registry import get_mode
from harness.workloads.synthetic import TOOLS, setup
from harness.world.boundary import Boundary
from harness.world.clock import VirtualClock
from harness.world.faults import (
    FaultClass,
    FaultConfig,
    FaultInjector,
    InjectedFault,
    Point,
    Role,
    ToolCallFailed,
    ToolTimeout,
)
from harness.world.oracle import duplicates, judge, leaks, residue
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolCall, ToolError

MODES = ("retry-only", "saga", "tcc", "checkpoint-replay")
LATENCY = 5.0
SETTINGS = ModeSettings()


class Scripted(FaultInjector):
    """A hand-made fault scenario: `script[(point, site, occurrence)]` is the fault to inject
    into the call's own delivery (role CALL), `script[(point, site, occurrence, role)]` into
    another role's (tcc's try). Occurrences count per (point, role, site), as the injector's."""

    def __init__(
        self, script: dict[tuple[Point, str, int] | tuple[Point, str, int, Role], FaultClass]
    ) -> None:
        super().__init__(FaultConfig(rate=0.0), seed=0, cell="scripted", trial=0)
        self.script = script
        self.asked: dict[tuple[Point, Role, str], int] = {}

    def decide(
        self, point: Point, site: str, *, role: Role = Role.CALL, agent: str = "",
        meta: dict[str, Any] | None = None,
    ) -> FaultClass | None:
        point, role = Point(point), Role(role)
        occurrence = self.asked.get((point, role, site), 0)
        self.asked[(point, role, site)] = occurrence + 1
        index, self.events = self.events, self.events + 1
        key = (point, site, occurrence) if role is Role.CALL else (point, site, occurrence, role)
        fault = self.script.get(key)
        if fault is not None:
            self.injected.append(InjectedFault(index, point, site, fault, occurrence, {}, agent, role))
        return fault


def every(fault: FaultClass) -> FaultInjector:
    """One fault class at rate 1.0: every applicable event gets it."""
    return FaultInjector(FaultConfig(rate=1.0, classes=fault.value), seed=3, cell="all", trial=0)


@dataclasses.dataclass
class Rig:
    """One agent's view of one trial: substrates, clock, boundary and the mode's shared state."""

    env: TrialEnv
    clock: VirtualClock
    boundary: Boundary
    trial: TrialMode

    def ctx(self, agent: str = "a0", attempt: int = 1) -> AgentContext:
        trace = f"test/{agent}/{attempt}"
        return AgentContext(agent, attempt, trace, self.env, self.clock, self.boundary, SETTINGS)

    def session(self, agent: str = "a0", attempt: int = 1) -> ModeSession:
        return self.trial.session(self.ctx(agent, attempt))

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run one coroutine to completion on the virtual clock; re-raise what it raised."""
        task = self.clock.spawn(coro, "test")
        self.clock.run()
        assert task.done
        if task.error is not None:
            raise task.error
        return task.result


@pytest.fixture
def rig_factory() -> Iterator[Any]:
    envs: list[TrialEnv] = []

    def make(mode: str, injector: FaultInjector | None = None) -> Rig:
        env = TrialEnv.create()
        envs.append(env)
        setup(env)
        clock = VirtualClock()
        boundary = Boundary(clock, injector, latency_ms=LATENCY, jitter_ms=0.0, rng=random.Random(0))
        return Rig(env, clock, boundary, get_mode(mode).factory(env, clock, SETTINGS))

    yield make
    for env in envs:
        env.close()


def call(tool: str, op: str, **args: Any) -> ToolCall:
    return ToolCall(TOOLS[tool], args, op_id=op)


def mutations(env: TrialEnv) -> list[Any]:
    """Mutations made by agents (setup writes carry no agent in their meta)."""
    return [
        op for op in env.oplog.ops()
        if op.meta.get("agent") and op.kind not in ("read", "dedup")
    ]


def world(env: TrialEnv) -> dict[str, Any]:
    """The ground truth without the mailbox (which no mode can roll back)."""
    snap = env.snapshot()
    snap.pop("mailbox")
    return snap


# ------------------------------------------------------------------------------ registry


def test_modes_are_registered_as_baselines() -> None:
    for name in MODES:
        info = get_mode(name)
        assert info.family == "baseline"
        assert info.description
        assert info.module.startswith("baselines.")


# ------------------------------------------------------------------------------ retry-only


def test_retry_only_retries_transient_faults_with_backoff_on_the_virtual_clock(rig_factory: Any) -> None:
    site = "a0/t/0"
    rig = rig_factory("retry-only", Scripted({(Point.CALL, site, 0): FaultClass.F1,
                                              (Point.CALL, site, 1): FaultClass.F1}))
    session = rig.session()
    assert rig.run(session.call(call("fs_write", site, path="docs/x.txt", text="hi"))) is True
    assert rig.env.files.read_text("docs/x.txt") == "hi"
    assert rig.boundary.deliveries == 3
    # Three round trips, plus 20 ms and 40 ms of backoff between them.
    assert rig.clock.now == pytest.approx(3 * LATENCY + 20 + 40)


def test_retry_only_gives_up_after_its_bound_and_pays_every_stall(rig_factory: Any) -> None:
    site = "a0/t/0"
    rig = rig_factory("retry-only", Scripted({(Point.CALL, site, i): FaultClass.F5 for i in range(4)}))
    session = rig.session()
    with pytest.raises(ToolTimeout):
        rig.run(session.call(call("db_put", site, table="rows", k=1, value={"v": 1})))
    assert rig.boundary.deliveries == 3  # the call and settings.step_retries = 2 retries
    stall = FaultConfig().stall_ms
    assert rig.clock.now == pytest.approx(3 * (LATENCY + stall) + 20 + 40)
    assert rig.env.db.get("rows", 1) is None


def test_retry_only_duplicates_an_effect_after_an_ambiguous_failure(rig_factory: Any) -> None:
    site = "a0/t/0"
    rig = rig_factory("retry-only", Scripted({(Point.CALL, site, 0): FaultClass.F2}))
    session = rig.session()
    rig.run(session.call(call("buf_add", site, name="c1", amount=5)))
    # The first delivery landed, its answer was lost, the retry applied it again.
    assert rig.env.buffer.get("c1") == 1 + 5 + 5
    assert duplicates(rig.env.oplog.ops()) == 1
    assert rig.clock.now == pytest.approx(2 * LATENCY + 20)


def test_retry_only_does_not_retry_a_tools_own_refusal(rig_factory: Any) -> None:
    rig = rig_factory("retry-only")
    rig.env.db.put("slots", 0, {"left": 0, "holders": []})
    session = rig.session()
    with pytest.raises(ToolError):
        rig.run(session.call(call("book", "a0/t/0", slot=0, who="me")))
    assert rig.boundary.deliveries == 1
    assert rig.clock.now == pytest.approx(LATENCY)


# ------------------------------------------------------------------------------ saga


def _saga_plan() -> list[ToolCall]:
    return [
        call("fs_write", "a0/t/0", path="docs/new.txt", text="draft\n"),
        call("db_incr", "a0/t/1", table="counters", k=2, by=4),
        call("book", "a0/t/2", slot=1, who="a0"),
        call("send", "a0/t/3", to="bob@example.com", subject="hi", body="booked"),
        call("buf_put", "a0/t/4", name="k9", value="v"),
    ]


def test_saga_compensates_in_reverse_order_and_cannot_recall_a_send(rig_factory: Any) -> None:
    rig = rig_factory("saga")
    initial = world(rig.env)
    session = rig.session()

    async def scenario() -> None:
        for c in _saga_plan():
            await session.call(c)
        await session.abort(AbortSource.TOOL_FAILURE, "test")

    rig.run(scenario())
    ops = mutations(rig.env)
    forward = [op.meta["op"] for op in ops if not op.meta.get("undo")]
    undone = [op.meta["op"] for op in ops if op.meta.get("undo")]
    assert forward == ["a0/t/0", "a0/t/1", "a0/t/2", "a0/t/3", "a0/t/4"]
    # Newest first; the send has no handler.
    assert undone == ["a0/t/4", "a0/t/2", "a0/t/1", "a0/t/0"]
    assert all(op.key is None for op in ops)
    # Every revocable effect is restored; the message is still in the sink's own file.
    assert world(rig.env) == initial
    assert [m["to"] for m in rig.env.mailbox.messages()] == ["bob@example.com"]
    assert leaks(rig.env.mailbox.messages(), committed=set()) == 1
    assert session.reported_residue == 0  # type: ignore[attr-defined]


def test_saga_counts_a_failed_compensation_as_reported_residue(rig_factory: Any) -> None:
    rig = rig_factory("saga", Scripted({(Point.COMPENSATE, "a0/t/1", 0): FaultClass.F3}))
    session = rig.session()
    plan = [c for c in _saga_plan() if c.name != "send"]

    async def scenario() -> None:
        for c in plan:
            await session.call(c)
        await session.abort(AbortSource.TOOL_FAILURE, "test")

    rig.run(scenario())
    assert session.reported_residue == 1  # type: ignore[attr-defined]
    # The failed handler left its effect; the handlers after it in the undo order still ran.
    assert rig.env.db.get("counters", 2) == 20 + 4
    assert rig.env.files.exists("docs/new.txt") is False
    assert rig.env.db.get("slots", 1) == {"left": 3, "holders": []}
    ops = rig.env.oplog.ops()
    assert residue(ops, committed=set()) == 1
    verdict = judge(final={}, expected=None, ops=ops, messages=rig.env.mailbox.messages(),
                    committed=set(), reported_residue=session.reported_residue)  # type: ignore[attr-defined]
    assert verdict.residue == 1 and verdict.unclassified_residue == 0


def test_saga_compensates_every_failed_call_since_it_cannot_tell_which_landed(
    rig_factory: Any,
) -> None:
    rig = rig_factory("saga", Scripted({(Point.CALL, "a0/t/0", 0): FaultClass.F2,
                                        (Point.CALL, "a0/t/1", 0): FaultClass.F1}))
    initial = world(rig.env)
    session = rig.session()

    async def scenario() -> None:
        with pytest.raises(ToolCallFailed):
            await session.call(call("buf_add", "a0/t/0", name="c3", amount=7))
        with pytest.raises(ToolCallFailed):
            await session.call(call("db_incr", "a0/t/1", table="counters", k=0, by=1))
        await session.abort(AbortSource.TOOL_FAILURE, "test")

    rig.run(scenario())
    assert world(rig.env) == initial
    undone = [op.meta["op"] for op in mutations(rig.env) if op.meta.get("undo")]
    # Newest first; the F1 call never landed, but the saga cannot know that, and restoring
    # its before-image is harmless.
    assert undone == ["a0/t/1", "a0/t/0"]
    assert residue(rig.env.oplog.ops(), committed=set()) == 0


def test_saga_commit_keeps_a_duplicate_from_a_retried_ambiguous_call(rig_factory: Any) -> None:
    rig = rig_factory("saga", Scripted({(Point.CALL, "a0/t/0", 0): FaultClass.F2}))
    session = rig.session()
    c = call("db_incr", "a0/t/0", table="counters", k=1, by=3)

    async def scenario() -> None:
        with pytest.raises(ToolCallFailed):
            await session.call(c)
        await session.call(c)  # the agent retries the step: no key, so it applies again
        await session.commit()

    rig.run(scenario())
    assert rig.env.db.get("counters", 1) == 10 + 3 + 3
    assert duplicates(rig.env.oplog.ops()) == 1


# ------------------------------------------------------------------------------ tcc


def _tcc_plan() -> list[ToolCall]:
    return [
        call("db_get", "a0/t/0", table="counters", k=3),
        call("db_incr", "a0/t/1", table="counters", k=3, by=2),
        call("book", "a0/t/2", slot=2, who="a0"),
        call("send", "a0/t/3", to="carol@example.com", subject="s", body="b"),
        call("fs_append", "a0/t/4", path="logs/l0.log", line="a0"),
    ]


def test_tcc_sends_nothing_before_confirm_and_everything_once_at_commit(rig_factory: Any) -> None:
    rig = rig_factory("tcc")
    initial = rig.env.snapshot()
    session = rig.session()
    results: list[Any] = []

    async def tries() -> None:
        for c in _tcc_plan():
            results.append(await session.call(c))

    rig.run(tries())
    assert results[0] == 30  # reads run at once
    assert all(isinstance(r, Ack) and r.status == "tried" for r in results[1:])
    assert rig.boundary.deliveries == 5  # one try round trip per effect-bearing call
    assert rig.env.snapshot() == initial and mutations(rig.env) == []
    assert rig.env.mailbox.messages() == []

    rig.run(session.commit())
    assert rig.env.db.get("counters", 3) == 32
    assert rig.env.db.get("slots", 2) == {"left": 2, "holders": ["a0"]}
    assert rig.env.files.read_text("logs/l0.log") == "log 0\na0\n"
    assert [m["to"] for m in rig.env.mailbox.messages()] == ["carol@example.com"]
    ops = mutations(rig.env)
    assert [op.meta["op"] for op in ops] == ["a0/t/1", "a0/t/2", "a0/t/3", "a0/t/4"]
    assert all(op.key == f"test/a0/1:{op.meta['op']}" for op in ops)


def test_tcc_abort_leaves_nothing_at_all(rig_factory: Any) -> None:
    rig = rig_factory("tcc")
    initial = rig.env.snapshot()
    session = rig.session()

    async def scenario() -> None:
        for c in _tcc_plan():
            await session.call(c)
        await session.abort(AbortSource.PRE_COMMIT_VETO, "test")

    rig.run(scenario())
    assert rig.env.snapshot() == initial
    assert mutations(rig.env) == [] and rig.env.mailbox.messages() == []
    assert leaks(rig.env.mailbox.messages(), committed=set()) == 0
    assert rig.boundary.deliveries == 5  # the tries; cancelling held nothing to release


def test_tcc_confirm_is_deduplicated_by_its_key_under_duplicate_delivery(rig_factory: Any) -> None:
    rig = rig_factory("tcc", every(FaultClass.F4))
    session = rig.session()

    async def scenario() -> None:
        for c in _tcc_plan():
            await session.call(c)
        await session.commit()

    rig.run(scenario())
    assert rig.env.db.get("counters", 3) == 32  # not 34
    assert rig.env.db.get("slots", 2) == {"left": 2, "holders": ["a0"]}
    assert rig.env.files.read_text("logs/l0.log") == "log 0\na0\n"
    assert len(rig.env.mailbox.messages()) == 1
    ops = rig.env.oplog.ops()
    assert sum(op.kind == "dedup" for op in ops) == 4  # every confirm's second delivery
    assert duplicates(ops) == 0


def test_tcc_confirm_retried_after_an_ambiguous_failure_applies_once(rig_factory: Any) -> None:
    # The try has its own role, so occurrence 0 of the call's own role is its first confirm.
    rig = rig_factory("tcc", Scripted({(Point.CALL, "a0/t/1", 0): FaultClass.F2}))
    session = rig.session()

    async def scenario() -> None:
        await session.call(call("db_incr", "a0/t/1", table="counters", k=3, by=2))
        await session.commit()

    rig.run(scenario())
    assert rig.env.db.get("counters", 3) == 32
    kinds = [op.kind for op in rig.env.oplog.ops() if op.meta.get("op") == "a0/t/1"]
    assert kinds == ["upsert", "dedup"]  # applied by the first confirm, deduplicated after
    assert rig.clock.now == pytest.approx(3 * LATENCY + 20)  # try, confirm, backoff, re-confirm


def test_tcc_failed_confirm_stops_the_rest_and_keeps_those_confirmed(rig_factory: Any) -> None:
    script = {(Point.CALL, "a0/t/2", i): FaultClass.F1 for i in range(SETTINGS.apply_attempts)}
    rig = rig_factory("tcc", Scripted(script))
    session = rig.session()

    async def scenario() -> None:
        for c in _tcc_plan():
            await session.call(c)
        await session.commit()

    with pytest.raises(Aborted) as info:
        rig.run(scenario())
    assert info.value.source is AbortSource.TOOL_FAILURE and not info.value.retryable
    assert rig.env.db.get("counters", 3) == 32  # confirmed before the failure: it stays
    assert rig.env.db.get("slots", 2) == {"left": 3, "holders": []}
    assert rig.env.mailbox.messages() == []  # never confirmed
    assert rig.env.files.read_text("logs/l0.log") == "log 0\n"


def test_tcc_try_checks_preconditions_and_can_fault(rig_factory: Any) -> None:
    rig = rig_factory("tcc", Scripted({(Point.CALL, "a0/t/1", 0, Role.TRY): FaultClass.F1}))
    rig.env.db.put("slots", 0, {"left": 0, "holders": []})
    session = rig.session()

    async def scenario() -> None:
        with pytest.raises(ToolError):
            await session.call(call("book", "a0/t/0", slot=0, who="a0"))
        with pytest.raises(ToolCallFailed):
            await session.call(call("buf_put", "a0/t/1", name="k0", value=1))
        await session.commit()

    rig.run(scenario())
    assert rig.boundary.deliveries == 2
    assert mutations(rig.env) == []


# ------------------------------------------------------------------------------ checkpoint-replay


def test_checkpoint_replay_saves_deep_copies_shared_by_a_resumed_attempt(rig_factory: Any) -> None:
    rig = rig_factory("checkpoint-replay")
    first = rig.session()
    assert first.resumes_from_checkpoint
    rig.run(first.abort(AbortSource.TOOL_FAILURE))
    assert first.restore() == (0, {})
    memory: dict[str, Any] = {"step0": {"rows": [1]}}
    first.checkpoint(1, memory)
    memory["step0"]["rows"].append(2)
    memory["step1"] = True
    # The resumed attempt is a new session with the same transaction identity.
    resumed = rig.session()
    assert resumed.restore() == (1, {"step0": {"rows": [1]}})


def _run_agent(rig: Rig, task: Task, policy: AgentPolicy) -> Any:
    def make_ctx(attempt: int) -> AgentContext:
        return rig.ctx("a0", attempt)

    return rig.run(run_agent(rig.trial, make_ctx, task, TOOLS, policy, random.Random(0)))


def test_checkpoint_replay_reapplies_an_effect_that_landed_before_an_f2(rig_factory: Any) -> None:
    task = Task("t", (
        Step("db_incr", {"table": "counters", "k": 1, "by": 1}),
        Step("buf_add", {"name": "c2", "amount": 5}),
        Step("fs_write", {"path": "docs/done.txt", "text": "ok"}),
    ))
    rig = rig_factory("checkpoint-replay", Scripted({(Point.CALL, "a0/t/1", 0): FaultClass.F2}))
    outcome = _run_agent(rig, task, AgentPolicy(step_retries=0))
    assert outcome.committed and outcome.attempts == 2
    assert outcome.committed_attempt == 1  # the replay continued the same transaction
    assert rig.env.db.get("counters", 1) == 11  # step 0 is before the checkpoint: not replayed
    assert rig.env.buffer.get("c2") == 2 + 5 + 5  # step 1 landed, then was replayed
    ops = rig.env.oplog.ops()
    assert duplicates(ops) == 1
    assert {op.meta["attempt"] for op in mutations(rig.env)} == {1}
    verdict = judge(final={}, expected=None, ops=ops, messages=rig.env.mailbox.messages(),
                    committed={("a0", 1)})
    assert verdict.duplicates == 1 and not verdict.clean


def test_checkpoint_replay_leaks_a_send_made_before_the_abort(rig_factory: Any) -> None:
    task = Task("t", (
        Step("send", {"to": "dave@example.com", "subject": "s", "body": "b"}),
        Step("book", {"slot": 0, "who": "a0"}),
    ))
    rig = rig_factory("checkpoint-replay")
    rig.env.db.put("slots", 0, {"left": 0, "holders": []})
    outcome = _run_agent(rig, task, AgentPolicy(step_retries=0, max_attempts=3))
    assert not outcome.committed and outcome.attempts == 3
    assert outcome.aborts == [AbortSource.TOOL_FAILURE.value] * 3
    # Each replay resumed after the send, so it was sent once, and it stays sent.
    messages = rig.env.mailbox.messages()
    assert len(messages) == 1
    assert leaks(messages, committed=set()) == 1


# ------------------------------------------------------------------------------ leaks by mechanism


@pytest.mark.parametrize(("mode", "leaked"), [
    ("retry-only", 1), ("saga", 1), ("tcc", 0), ("checkpoint-replay", 1),
])
def test_a_vetoed_transaction_leaks_its_send_unless_it_was_gated(
    rig_factory: Any, mode: str, leaked: int
) -> None:
    task = Task("t", (
        Step("send", {"to": "erin@example.com", "subject": "s", "body": "b"}),
        Step("buf_put", {"name": "k1", "value": 1}),
    ), veto=True)
    rig = rig_factory(mode)
    outcome = _run_agent(rig, task, AgentPolicy())
    assert outcome.vetoed and not outcome.committed
    assert leaks(rig.env.mailbox.messages(), committed=set()) == leaked


# ------------------------------------------------------------------------------ whole trials


def _spec(mode: str, trial: int, fault: FaultConfig | None = None) -> TrialSpec:
    return TrialSpec(config="test", workload="synthetic", mode=mode, cell_id="fp0", cell={},
                     trial=trial, seed=11, faults=fault or FaultConfig(rate=0.0))


@pytest.mark.parametrize("mode", MODES)
def test_fault_free_synthetic_trials_are_clean_and_deterministic(mode: str) -> None:
    for trial in range(4):
        record = run_trial(_spec(mode, trial))
        assert record["metrics"]["clean"], record
        assert record["metrics"]["committed"] == 1
        again = run_trial(_spec(mode, trial))
        record.pop("timings"), again.pop("timings")
        assert record == again


@pytest.mark.parametrize("mode", MODES)
def test_faulted_trials_are_deterministic(mode: str) -> None:
    spec = dataclasses.replace(_spec(mode, 5), faults=FaultConfig(rate=0.3), cell_id="mixed")
    first, second = run_trial(spec), run_trial(spec)
    first.pop("timings"), second.pop("timings")
    assert first == second
