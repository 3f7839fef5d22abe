"""Tests of the ablations that remove one component of tx-full: the gate (`tx-no-gate`),
idempotency keys at the substrate (`tx-unkeyed`), compensation (`tx-no-compensation`), the read
checks (`tx-no-read-checks`) and the seal (`tx-no-seal`).

Each drives the mode's session on real substrates (a SQLite database, files, the append-only
mailbox file) through the fault boundary on the virtual clock, and judges from the substrates
and the op log as the oracle does: under tx-full the component's guarantee holds, under its
ablation the same steps break it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from atomix.effects import AbortSource
from harness.modes.base import Aborted, AgentContext, ModeSettings, TrialMode
from harness.modes.registry import MODES, get_mode
from harness.modes.tx import TxModeSession
from harness.workloads.synthetic import TOOLS, setup
from harness.world.boundary import Boundary
from harness.world.clock import VirtualClock
from harness.world.faults import FaultClass, FaultConfig, FaultInjector, Point
from harness.world.oracle import duplicates, leaks, residue
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolCall

SETTINGS = ModeSettings()
NEW = ("tx-no-gate", "tx-unkeyed", "tx-no-compensation", "tx-no-read-checks", "tx-no-seal")


class Scripted(FaultInjector):
    """`script[(point, site, occurrence)]`: the fault for that delivery of that logical call
    (occurrences counted per point and site); nothing else is faulted."""

    def __init__(self, script: dict[tuple[Point, str, int], FaultClass]) -> None:
        super().__init__(FaultConfig(rate=0.0), seed=0, cell="scripted", trial=0)
        self.script = script
        self.asked: dict[tuple[Point, str], int] = {}

    def decide(self, point: Point, site: str, **_: Any) -> FaultClass | None:
        point = Point(point)
        occurrence = self.asked.get((point, site), 0)
        self.asked[(point, site)] = occurrence + 1
        return self.script.get((point, site, occurrence))


@dataclasses.dataclass
class Rig:
    env: TrialEnv
    clock: VirtualClock
    boundary: Boundary
    trial: TrialMode

    def session(self, agent: str = "a0", attempt: int = 1) -> TxModeSession:
        ctx = AgentContext(
            agent, attempt, f"test/{agent}/{attempt}", self.env, self.clock, self.boundary, SETTINGS
        )
        session = self.trial.session(ctx)
        assert isinstance(session, TxModeSession)
        return session

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        task = self.clock.spawn(coro, "test")
        self.clock.run()
        assert task.done
        if task.error is not None:
            raise task.error
        return task.result


@pytest.fixture
def rig() -> Iterator[Any]:
    envs: list[TrialEnv] = []

    def make(mode: str, injector: FaultInjector | None = None) -> Rig:
        env = TrialEnv.create()
        envs.append(env)
        setup(env)
        clock = VirtualClock()
        boundary = Boundary(clock, injector, latency_ms=5.0, jitter_ms=0.0, rng=random.Random(0))
        return Rig(env, clock, boundary, get_mode(mode).factory(env, clock, SETTINGS))

    yield make
    for env in envs:
        env.close()


def call(tool: str, op: str, **args: Any) -> ToolCall:
    return ToolCall(TOOLS[tool], args, op_id=op)


def test_each_new_ablation_is_a_registered_ablation_of_tx_full() -> None:
    for name in NEW:
        info = get_mode(name)
        assert info.family == "ablation" and info.module == "harness.modes.tx"
        assert MODES.entry(name).description.startswith("ablation of tx-full: ")


# ------------------------------------------------------------------------------ the gate


@pytest.mark.parametrize("mode", ["tx-full", "tx-no-gate"])
def test_without_the_gate_an_aborted_attempts_mail_has_left(rig: Any, mode: str) -> None:
    r = rig(mode)
    session = r.session()
    mail = call("send", "a0/t/0", to="carol@example.com", subject="offer", body="b")

    async def attempt() -> int:
        await session.begin()
        await session.call(mail)
        in_sink_before_commit = len(r.env.messages())
        await session.abort(AbortSource.PRE_COMMIT_VETO, "dropped")
        return in_sink_before_commit

    in_sink_at_call = r.run(attempt())
    messages = r.env.messages()
    if mode == "tx-full":
        assert in_sink_at_call == 0 and messages == [] and leaks(messages, set()) == 0
        assert session.reported_residue == 0
    else:
        assert in_sink_at_call == 1 and [m["to"] for m in messages] == ["carol@example.com"]
        assert leaks(messages, set()) == 1
        # The runtime knows the mail left and cannot be undone: it reports it as residue.
        assert session.reported_residue == 1 == residue(r.env.oplog.ops(), set())


@pytest.mark.parametrize("mode", ["tx-full", "tx-no-gate"])
def test_a_committed_ungated_mail_is_sent_once_not_released_again(rig: Any, mode: str) -> None:
    r = rig(mode)
    session = r.session()

    async def attempt() -> None:
        await session.begin()
        await session.call(call("send", "a0/t/0", to="d@example.com", subject="s", body="b"))
        await session.commit()

    r.run(attempt())
    assert len(r.env.messages()) == 1
    done = session.settlement
    assert done is not None
    # Gated: released from the gate at commit. Ungated: it ran when called, accepted as final.
    assert (len(done.released), len(done.accepted)) == ((0, 1) if mode == "tx-no-gate" else (1, 0))


# ------------------------------------------------------------------------------ keys


@pytest.mark.parametrize("mode", ["tx-full", "tx-unkeyed"])
def test_without_keys_an_ambiguous_commit_time_apply_lands_twice(rig: Any, mode: str) -> None:
    """F2 on the commit-time apply of a non-idempotent bufferable append: the append lands,
    the call fails, the runtime re-applies under the effect's key (same budget in both)."""
    site = "a0/t/0"
    r = rig(mode, Scripted({(Point.CALL, site, 0): FaultClass.F2}))
    session = r.session()

    async def attempt() -> None:
        await session.begin()
        await session.call(call("fs_append", site, path="logs/l1.log", line="entry"))
        await session.commit()

    r.run(attempt())
    text = r.env.files.read("logs/l1.log")
    ops = r.env.oplog.ops()
    if mode == "tx-full":
        assert text == b"log 1\nentry\n" and duplicates(ops) == 0
        assert [op.kind for op in ops if op.meta.get("op") == site] == ["write", "dedup"]
    else:
        assert text == b"log 1\nentry\nentry\n" and duplicates(ops) == 1


@pytest.mark.parametrize("mode", ["tx-full", "tx-unkeyed"])
def test_without_keys_a_duplicated_release_sends_two_mails(rig: Any, mode: str) -> None:
    site = "a0/t/0"
    r = rig(mode, Scripted({(Point.CALL, site, 0): FaultClass.F4}))
    session = r.session()

    async def attempt() -> None:
        await session.begin()
        await session.call(call("send", site, to="e@example.com", subject="s", body="b"))
        await session.commit()

    r.run(attempt())
    sent = len(r.env.messages())
    assert (sent, duplicates(r.env.oplog.ops())) == ((1, 0) if mode == "tx-full" else (2, 1))


# ------------------------------------------------------------------------------ compensation


@pytest.mark.parametrize("mode", ["tx-full", "tx-no-compensation"])
def test_without_compensation_an_abort_leaves_the_reversible_write(rig: Any, mode: str) -> None:
    r = rig(mode)
    before = r.env.db.get("slots", 2)
    session = r.session()

    async def attempt() -> None:
        await session.begin()
        await session.call(call("book", "a0/t/0", slot=2, who="a0"))
        await session.abort(AbortSource.TOOL_FAILURE, "a later step failed")

    r.run(attempt())
    after = r.env.db.get("slots", 2)
    left = residue(r.env.oplog.ops(), set())
    if mode == "tx-full":
        assert after == before and left == 0 and session.reported_residue == 0
    else:
        assert after == {"left": before["left"] - 1, "holders": ["a0"]}
        assert left == 1 and session.reported_residue == 1  # reported: not unclassified


# ------------------------------------------------------------------------------ read checks


@pytest.mark.parametrize("mode", ["tx-full", "tx-no-read-checks"])
def test_without_read_checks_a_stale_read_commits(rig: Any, mode: str) -> None:
    """The writer (earlier epoch) commits a new counter after the reader read it; the reader
    then writes what it computed from the old value."""
    r = rig(mode)
    writer, reader = r.session("w"), r.session("r")

    async def interleaved() -> str:
        await writer.begin()
        await reader.begin()
        seen = await reader.call(call("db_get", "r/t/0", table="counters", k=1))
        await writer.call(call("db_put", "w/t/0", table="counters", k=1, value=100))
        await writer.commit()
        await reader.call(call("db_put", "r/t/1", table="counters", k=1, value=seen + 1))
        try:
            await reader.commit()
        except Aborted as exc:
            return exc.source.value
        return "committed"

    outcome = r.run(interleaved())
    value = r.env.db.get("counters", 1)
    if mode == "tx-full":
        assert (outcome, value) == ("stale_read", 100)
    else:
        assert (outcome, value) == ("committed", 11)  # the writer's update is lost


# ------------------------------------------------------------------------------ the seal


@pytest.mark.parametrize("mode", ["tx-full", "tx-no-seal"])
def test_without_the_seal_a_write_after_seal_is_admitted(rig: Any, mode: str) -> None:
    """The harness's shim seals only inside commit, so no workload makes this access; here the
    session is sealed by hand first, then called."""
    r = rig(mode)
    session = r.session()

    async def attempt() -> str:
        await session.begin()
        await session.call(call("db_put", "a0/t/0", table="rows", k=1, value="first"))
        assert session.tx is not None
        session.tx.seal()
        try:
            await session.call(call("db_put", "a0/t/1", table="rows", k=2, value="late"))
        except Aborted as exc:
            return exc.source.value
        await session.commit()
        return "committed"

    outcome = r.run(attempt())
    rows = (r.env.db.get("rows", 1), r.env.db.get("rows", 2))
    if mode == "tx-full":
        assert (outcome, rows) == ("seal_violation", (None, None))
    else:
        assert (outcome, rows) == ("committed", ("first", "late"))
