"""The scripted agent: performs a task's plan under any mode, reacting like a real agent.

It retries a failed step up to a bound, re-reads and re-plans (a fresh attempt) after an
abort-on-stale or a time-out, resumes from a checkpoint when the mode offers one, and
commits at the end. The same code runs under every mode.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atomix.effects import AbortSource
from harness import faults
from harness.clock import Sleep
from harness.modes import Aborted, AgentContext, ModeSession, TrialMode
from harness.substrates import TrialEnv
from harness.tooling import ToolCall, ToolDef, ToolError

ArgsFn = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Step:
    """One tool call of a plan; `args` may be computed from what earlier steps returned."""

    tool: str
    args: Mapping[str, Any] | ArgsFn
    save_as: str | None = None


@dataclass(frozen=True, slots=True)
class Task:
    """A plan of steps settled as one transaction.

    `veto` aborts it just before commit (a pre-commit veto); `abort_source` does the same
    with another source (a selector dropping a losing branch). `validate` lists read steps
    the agent re-runs before committing: if one returns something else now, the plan was
    made on stale data and the agent aborts with `stale_read`.

    `footprint` declares scopes the plan may touch beyond what its static steps show (steps
    whose arguments depend on earlier results); lock-up-front mechanisms use it.
    """

    task_id: str
    steps: tuple[Step, ...]
    veto: bool = False
    footprint: tuple[str, ...] = ()
    abort_source: AbortSource | None = None
    validate: tuple[int, ...] = ()


def declared_scopes(task: Task, tools: Mapping[str, ToolDef], env: TrialEnv) -> list[str]:
    """Every scope the task declares up front: its static steps' scopes plus `footprint`."""
    scopes: set[str] = set(task.footprint)
    for step in task.steps:
        if callable(step.args):
            continue
        tool = tools[step.tool]
        scopes.update(tool.reads(env, dict(step.args)))
        scopes.update(tool.writes(env, dict(step.args)))
    return sorted(scopes)


@dataclass(frozen=True, slots=True)
class AgentPolicy:
    """How persistent the agent is, and how long it thinks (simulated ms, seeded)."""

    step_retries: int = 2
    max_attempts: int = 4
    plan_delay_ms: tuple[float, float] = (0.0, 0.0)
    replan_backoff_ms: float = 10.0
    # False: a tool's own refusal is a result the agent reads and moves on from (as an LLM
    # agent reads an error message); True: it fails the step.
    tool_errors_fatal: bool = True


@dataclass(slots=True)
class AgentOutcome:
    """What the agent observed: did its transaction commit, after how many attempts."""

    agent: str
    task_id: str
    committed: bool = False
    vetoed: bool = False
    attempts: int = 0
    committed_attempt: int | None = None
    aborts: list[str] = field(default_factory=list)
    failure: str | None = None
    blocked_ms: float = 0.0
    finished_at_ms: float = 0.0
    reported_residue: int = 0
    results: dict[str, Any] = field(default_factory=dict)


class StepFailed(Exception):
    """A step kept failing after its retries, or the tool refused it."""

    def __init__(
        self, message: str, source: AbortSource = AbortSource.TOOL_FAILURE, *, permanent: bool = False
    ) -> None:
        super().__init__(message)
        self.source = source
        self.permanent = permanent  # the tool refused: trying the plan again cannot help


async def _call_with_retries(
    session: ModeSession, call: ToolCall, policy: AgentPolicy
) -> Any:
    last: BaseException | None = None
    for _ in range(policy.step_retries + 1):
        try:
            return await session.call(call)
        except faults.ToolFault as exc:
            last = exc
        except ToolError as exc:
            if not policy.tool_errors_fatal:
                return {"error": str(exc)}
            raise StepFailed(f"{call.name}: {exc}", permanent=True) from exc
    source = AbortSource.TIMEOUT if isinstance(last, faults.ToolTimeout) else AbortSource.TOOL_FAILURE
    raise StepFailed(f"{call.name}: {last}", source) from last


async def run_agent(
    trial: TrialMode,
    make_ctx: Callable[[int], AgentContext],
    task: Task,
    tools: Mapping[str, ToolDef],
    policy: AgentPolicy,
    rng: random.Random,
) -> AgentOutcome:
    """Run `task` to commit (or give up) under the trial's mode."""
    outcome = AgentOutcome(agent="", task_id=task.task_id)
    resume: tuple[int, dict[str, Any]] | None = None
    ctx: AgentContext | None = None
    tx_attempt = 0  # the transaction's identity; a checkpoint resume continues the same one
    while outcome.attempts < policy.max_attempts:
        outcome.attempts += 1
        if resume is None:
            tx_attempt += 1
        ctx = make_ctx(tx_attempt)
        outcome.agent = ctx.agent
        ctx.extra["declared_scopes"] = declared_scopes(task, tools, ctx.env)
        session = trial.session(ctx)
        start, memory = (0, {}) if resume is None else (resume[0], dict(resume[1]))
        try:
            await session.begin()
            for index in range(start, len(task.steps)):
                step = task.steps[index]
                lo, hi = policy.plan_delay_ms
                if hi > 0:
                    await Sleep(rng.uniform(lo, hi))
                args = step.args(memory) if callable(step.args) else dict(step.args)
                call = ToolCall(tools[step.tool], args, op_id=f"{ctx.agent}/{task.task_id}/{index}")
                memory[step.save_as or f"step{index}"] = await _call_with_retries(session, call, policy)
                session.checkpoint(index + 1, memory)
            for index in task.validate:
                step = task.steps[index]
                args = step.args(memory) if callable(step.args) else dict(step.args)
                again = ToolCall(tools[step.tool], args, op_id=f"{ctx.agent}/{task.task_id}/v{index}")
                if await _call_with_retries(session, again, policy) != memory[step.save_as or f"step{index}"]:
                    detail = f"step {index} reads something else now"
                    await session.abort(AbortSource.STALE_READ, detail)
                    raise Aborted(AbortSource.STALE_READ, detail, retryable=False)
            stop = task.abort_source or (AbortSource.PRE_COMMIT_VETO if task.veto else None)
            if stop is not None:
                await session.abort(stop, "the agent dropped the plan before commit")
                outcome.vetoed = True
                outcome.aborts.append(stop.value)
                break
            await session.commit()
            outcome.committed = True
            outcome.committed_attempt = tx_attempt
            outcome.failure = None
            outcome.results = memory
            break
        except Aborted as exc:
            outcome.aborts.append(exc.source.value)
            if not exc.retryable:
                outcome.failure = str(exc)
                break
            resume = session.restore()
            await Sleep(policy.replan_backoff_ms * rng.uniform(0.5, 1.5))
        except StepFailed as exc:
            outcome.failure = str(exc)
            try:
                await session.abort(exc.source, str(exc))
                outcome.aborts.append(exc.source.value)
            except Aborted as again:
                outcome.aborts.append(again.source.value)
            resume = session.restore()
            if resume is None and (exc.permanent or not session.restarts_after_abort):
                break
        finally:
            outcome.reported_residue += getattr(session, "reported_residue", 0)
            outcome.blocked_ms += ctx.blocked_ms
            ctx.blocked_ms = 0.0
    else:
        outcome.failure = outcome.failure or f"gave up after {policy.max_attempts} attempts"
    assert ctx is not None
    outcome.finished_at_ms = ctx.clock.now
    return outcome
