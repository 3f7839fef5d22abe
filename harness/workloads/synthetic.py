"""The synthetic substrate workload (paper Table 9): one agent, 6-12 tool calls across the
four substrates (buffer, files, SQLite, mailbox) with mixed effect classes.

Every write is a real operation on a real substrate. Some writes are blind overwrites
(idempotent); others add, append or book (applying them twice changes the state), so
duplicates and lost effects show in the final state as well as in the op log.

Parameters (`params.*` in a config):

- `agents` (default 1): concurrent agents, one task each (the goal state is known for one).
- `step_retries` (default 2): how often the agent retries a failed call.
- `veto_rate` (default 0.0, a probability): the fraction of tasks the agent vetoes right
  before commit (a pre-commit veto), drawn per task from the trial's scenario
  seed after the plans, so every mode and every fault cell sees the same plans and the same
  vetoes. A vetoed task's goal is that none of its effects remain: its plan is left out of
  the goal state. This is what makes F3 (a compensation fails) measurable: a compensation
  only happens when a transaction aborts after effects were externalised, and without
  aborts no mode compensates, so an F3-only cell injects nothing. A veto is a
  mode-independent abort source that leaves the fault stream F3-only; mixing in F1 instead
  would make aborts depend on retries being exhausted (rare at low fp) and put F1 failures
  into the F3 column.
- `min_bookings` (default 0): every plan holds at least this many reversible bookings
  (inserted at random places, beyond the 6-12 drawn calls). An abort compensates only what
  was externalised; Atomix buffers and gates everything but reversible effects, so a vetoed
  plan without a booking gives tx-full nothing to compensate and F3 nothing to fail: with
  one booking per plan, the condition F3 names can occur in every trial under every mode
  that compensates.
- `sends` (default true): false draws no irreversible sends. A send that an abort cannot
  call back is a leak, not a failed compensation; leaving sends out of a vetoed plan keeps
  leaks out of a column that measures compensation failures.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from atomix.effects import EffectClass
from harness.agents.task import AgentPolicy, Step, Task
from harness.workloads.base import Scenario, WorkloadParams
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolDef, ToolError


def _none(env: TrialEnv, args: dict[str, Any]) -> list[str]:
    return []


# -- buffer ---------------------------------------------------------------------------------------
def _buf_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.buffer.scope(a["name"])]


def _buf_get(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    return env.buffer.get(a["name"], log_read=True, meta=d.meta)


def _buf_put(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.buffer.put(a["name"], a["value"], key=d.key, meta=d.meta)


def _buf_add(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    current = env.buffer.get(a["name"]) or 0
    return env.buffer.put(a["name"], current + a["amount"], key=d.key, meta=d.meta)


def _buf_before(env: TrialEnv, a: dict[str, Any]) -> Any:
    return env.buffer.get(a["name"])


def _buf_undo(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    if before is None:
        env.buffer.delete(a["name"], key=d.key, meta=d.meta)
    else:
        env.buffer.put(a["name"], before, key=d.key, meta=d.meta)


# -- files ----------------------------------------------------------------------------------------
def _fs_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.files.scope(a["path"])]


def _fs_read(env: TrialEnv, a: dict[str, Any], d: Delivery) -> str | None:
    return env.files.read_text(a["path"], log_read=True, meta=d.meta)


def _fs_write(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.files.write(a["path"], a["text"], key=d.key, meta=d.meta)


def _fs_append(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    current = env.files.read_text(a["path"]) or ""
    return env.files.write(a["path"], current + a["line"] + "\n", key=d.key, meta=d.meta)


def _fs_before(env: TrialEnv, a: dict[str, Any]) -> bytes | None:
    return env.files.before_image(a["path"])


def _fs_undo(env: TrialEnv, a: dict[str, Any], before: bytes | None, d: Delivery) -> None:
    if before is None:
        env.files.delete(a["path"], key=d.key, meta=d.meta)
    else:
        env.files.write(a["path"], before, key=d.key, meta=d.meta)


# -- SQLite ---------------------------------------------------------------------------------------
def _db_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.db.scope(a["table"], a["k"])]


def _db_get(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
    return env.db.get(a["table"], a["k"], log_read=True, meta=d.meta)


def _db_put(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.db.put(a["table"], a["k"], a["value"], key=d.key, meta=d.meta)


def _db_incr(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    current = env.db.get(a["table"], a["k"]) or 0
    return env.db.put(a["table"], a["k"], current + a["by"], key=d.key, meta=d.meta)


def _db_before(env: TrialEnv, a: dict[str, Any]) -> Any:
    return env.db.get(a["table"], a["k"])


def _db_undo(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    if before is None:
        env.db.delete(a["table"], a["k"], key=d.key, meta=d.meta)
    else:
        env.db.put(a["table"], a["k"], before, key=d.key, meta=d.meta)


def _book(env: TrialEnv, a: dict[str, Any], d: Delivery) -> dict[str, Any]:
    slot = env.db.get("slots", a["slot"]) or {"left": 0, "holders": []}
    if slot["left"] <= 0:
        raise ToolError(f"slot {a['slot']} is full")
    slot = {"left": slot["left"] - 1, "holders": [*slot["holders"], a["who"]]}
    env.db.put("slots", a["slot"], slot, key=d.key, meta=d.meta)
    return slot


def _book_check(env: TrialEnv, a: dict[str, Any]) -> None:
    slot = env.db.get("slots", a["slot"]) or {"left": 0}
    if slot["left"] <= 0:
        raise ToolError(f"slot {a['slot']} is full")


def _slot_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.db.scope("slots", a["slot"])]


def _slot_undo(env: TrialEnv, a: dict[str, Any], before: Any, d: Delivery) -> None:
    _db_undo(env, {"table": "slots", "k": a["slot"]}, before, d)


# -- mailbox --------------------------------------------------------------------------------------
def _mail_scope(env: TrialEnv, a: dict[str, Any]) -> list[str]:
    return [env.mailbox.scope(a["to"])]


def _send(env: TrialEnv, a: dict[str, Any], d: Delivery) -> bool:
    return env.mailbox.send(a["to"], a["subject"], a["body"], key=d.key, meta=d.meta)


B, R, IRR = EffectClass.BUFFERABLE, EffectClass.REVERSIBLE, EffectClass.IRREVERSIBLE

TOOLS: dict[str, ToolDef] = {
    t.name: t
    for t in (
        ToolDef("buf_get", None, _buf_scope, _none, _buf_get),
        ToolDef("buf_put", B, _none, _buf_scope, _buf_put, _buf_before, _buf_undo, idempotent=True),
        ToolDef("buf_add", B, _none, _buf_scope, _buf_add, _buf_before, _buf_undo),
        ToolDef("fs_read", None, _fs_scope, _none, _fs_read),
        ToolDef("fs_write", B, _none, _fs_scope, _fs_write, _fs_before, _fs_undo, idempotent=True),
        ToolDef("fs_append", B, _none, _fs_scope, _fs_append, _fs_before, _fs_undo),
        ToolDef("db_get", None, _db_scope, _none, _db_get),
        ToolDef("db_put", B, _none, _db_scope, _db_put, _db_before, _db_undo, idempotent=True),
        ToolDef("db_incr", B, _none, _db_scope, _db_incr, _db_before, _db_undo),
        ToolDef(
            "book", R, _none, _slot_scope, _book,
            lambda env, a: env.db.get("slots", a["slot"]), _slot_undo, _book_check,
        ),
        ToolDef("send", IRR, _none, _mail_scope, _send),
    )
}

_WRITES = ("buf_put", "buf_add", "fs_write", "fs_append", "db_put", "db_incr", "book", "send")
_WRITES_WITHOUT_SENDS = tuple(k for k in _WRITES if k != "send")


def _random_step(rng: random.Random, agent: str, i: int, kinds: tuple[str, ...] = _WRITES) -> list[Step]:
    kind = rng.choice(kinds)
    n = rng.randrange(4)
    if kind == "buf_put":
        return [Step("buf_put", {"name": f"k{n}", "value": f"{agent}-{i}"})]
    if kind == "buf_add":
        return [Step("buf_get", {"name": f"c{n}"}), Step("buf_add", {"name": f"c{n}", "amount": rng.randint(1, 9)})]
    if kind == "fs_write":
        return [Step("fs_write", {"path": f"docs/f{n}.txt", "text": f"{agent} wrote {i}\n"})]
    if kind == "fs_append":
        return [Step("fs_read", {"path": f"logs/l{n}.log"}), Step("fs_append", {"path": f"logs/l{n}.log", "line": f"{agent}:{i}"})]
    if kind == "db_put":
        return [Step("db_put", {"table": "rows", "k": n, "value": {"by": agent, "step": i}})]
    if kind == "db_incr":
        return [Step("db_get", {"table": "counters", "k": n}), Step("db_incr", {"table": "counters", "k": n, "by": rng.randint(1, 5)})]
    if kind == "book":
        return [Step("book", {"slot": n, "who": f"{agent}-{i}"})]
    return [Step("send", {"to": f"user{n}@example.com", "subject": f"step {i}", "body": f"from {agent}"})]


def make_task(
    rng: random.Random, agent: str, task_id: str, *, min_calls: int = 6, max_calls: int = 12,
    min_bookings: int = 0, sends: bool = True,
) -> Task:
    """A random plan of `min_calls` to `max_calls` calls; with `min_bookings`, reversible
    bookings are inserted at random places until it holds that many; without `sends`, no
    irreversible send. With the defaults the draws are exactly those of the plain plan."""
    kinds = _WRITES if sends else _WRITES_WITHOUT_SENDS
    target = rng.randint(min_calls, max_calls)
    steps: list[Step] = []
    while len(steps) < target:
        for step in _random_step(rng, agent, len(steps), kinds):
            if len(steps) < target:
                steps.append(step)
    for n in range(min_bookings - sum(step.tool == "book" for step in steps)):
        steps.insert(rng.randint(0, len(steps)), Step("book", {"slot": rng.randrange(4), "who": f"{agent}-b{n}"}))
    return Task(task_id, tuple(steps))


def setup(env: TrialEnv) -> None:
    """Initial state, written directly (no agent, so the oracle ignores these ops). Every
    table exists from the start, so a row written and then undone leaves the database as it
    was, not with an extra empty table that no goal state has."""
    env.db.ensure_table("rows")
    env.db.put_many(
        [("slots", n, {"left": 3, "holders": []}) for n in range(4)]
        + [("counters", n, 10 * n) for n in range(4)]
    )
    for n in range(4):
        env.buffer.put(f"c{n}", n)
        env.files.write(f"logs/l{n}.log", f"log {n}\n")


def run_directly(tasks: list[Task], tools: Mapping[str, ToolDef]) -> dict[str, Any]:
    """The goal state: the tasks' plans applied once, in order, with no faults and no mode."""
    env = TrialEnv.create()
    try:
        setup(env)
        for task in tasks:
            if task.veto:
                continue  # vetoed before commit: none of its effects belong in the goal
            memory: dict[str, Any] = {}
            for index, step in enumerate(task.steps):
                args = step.args(memory) if callable(step.args) else dict(step.args)
                memory[step.save_as or f"step{index}"] = tools[step.tool].run(env, args, Delivery(None, {}))
        return env.snapshot()
    finally:
        env.close()


class SyntheticParams(WorkloadParams):
    """`params` of the synthetic workload (see the module docstring)."""

    # Each agent is a thread with its own task; beyond 64 a trial takes seconds, not ms.
    agents: int = Field(1, ge=1, le=64)
    step_retries: int = Field(2, ge=0, le=20)
    veto_rate: float = Field(0.0, ge=0.0, le=1.0)
    min_bookings: int = Field(0, ge=0, le=12)
    sends: bool = True


class SyntheticWorkload:
    """Paper Table 9's synthetic substrate workload."""

    name = "synthetic"
    description = "6-12 mixed-class tool calls across buffer, files, SQLite and mailbox"
    tools = TOOLS
    Params = SyntheticParams

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        p = SyntheticParams.model_validate(params)
        tasks = [make_task(rng, f"a{i}", f"t{trial}-{i}", min_bookings=p.min_bookings, sends=p.sends)
                 for i in range(p.agents)]
        if p.veto_rate > 0.0:
            # Drawn after the plans, so the plans are the same whatever the veto rate.
            vetoes = [rng.random() < p.veto_rate for _ in tasks]
            tasks = [dataclasses.replace(t, veto=v) for t, v in zip(tasks, vetoes, strict=True)]
        return Scenario(
            tasks=tasks,
            setup=setup,
            expected=(lambda: run_directly(tasks, TOOLS)) if p.agents == 1 else None,
            policy=AgentPolicy(step_retries=p.step_retries),
        )
