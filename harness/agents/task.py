"""The agent loop: performs a task's plan under any mode, commits at the end.

How it reacts to a failed call (retry, change an argument, carry on, re-plan, give up,
restart, read the object back first) is its policy's decision (`harness.agents.policies`);
the loop carries it out, counts the tool calls against the policy's step budget (a read-back
is a real call through the mode, charged like any other), restarts after a retryable abort
by the mode (or resumes from the mode's checkpoint), and commits. A re-plan skips the writes
the agent saw succeed in the transaction unless the policy says it forgot them, and a
policy's unprompted mistake (`Policy.mistake`) is carried out here too. The same code runs
under every mode.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from atomix.effects import AbortSource, EffectClass
from harness.agents.policies import Failure, GoldPolicy, Mistake, Policy, Reaction
from harness.modes.base import Aborted, AgentContext, ModeSession, TrialMode
from harness.world import faults
from harness.world.clock import Sleep
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolCall, ToolDef, ToolError

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

    `ticket` is the request in words, for an agent that plans by itself (`agent.kind: llm`);
    None when the task is only its gold plan.
    """

    task_id: str
    steps: tuple[Step, ...]
    veto: bool = False
    footprint: tuple[str, ...] = ()
    abort_source: AbortSource | None = None
    validate: tuple[int, ...] = ()
    ticket: str | None = None


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
    # Calls the agent made to irreversible tools (whatever the mode did with them): the
    # denominator a leakage cell needs to say whether it was exercised at all.
    irreversible_calls: int = 0
    steps: int = 0  # tool calls the agent issued (tau2's step count)
    out_of_budget: bool = False  # it stopped because its step budget ran out
    reactions: list[str] = field(default_factory=list)  # its reaction to each failed call
    results: dict[str, Any] = field(default_factory=dict)
    # The wrong action it made with no fault (a policy's `intrinsic_error`): "alter" or
    # "stop"; None when it made none.
    mistake: str | None = None


class StepFailed(Exception):
    """The agent stops its attempt: it gave up, restarts, or its step budget ran out."""

    def __init__(
        self,
        message: str,
        source: AbortSource = AbortSource.TOOL_FAILURE,
        *,
        permanent: bool = False,
        restart: bool = True,
        out_of_budget: bool = False,
    ) -> None:
        super().__init__(message)
        self.source = source
        self.out_of_budget = out_of_budget
        self.permanent = permanent  # the tool refused: trying the plan again cannot help
        self.restart = restart  # False: the agent ends the task (gave up, or out of budget)


class _Budget:
    """Tool calls the agent may still issue (tau2's max_steps); None: unlimited."""

    def __init__(self, max_steps: int | None) -> None:
        self.max_steps = max_steps
        self.used = 0

    def spend(self, call: ToolCall) -> None:
        if self.max_steps is not None and self.used >= self.max_steps:
            raise StepFailed(
                f"step budget of {self.max_steps} tool calls exhausted before {call.name}",
                restart=False,
                out_of_budget=True,
            )
        self.used += 1


async def _deliver(
    session: ModeSession, call: ToolCall, policy: Policy, budget: _Budget
) -> tuple[bool, Any, Failure | None]:
    """One agent call, plus the integration's wrapper retries below the agent (not charged
    to the budget). Returns (ok, result, failure)."""
    budget.spend(call)
    wrapper = policy.wrapper_retries
    for attempt in range(wrapper + 1):
        try:
            return True, await session.call(call), None
        except faults.ToolFault as exc:
            if attempt < wrapper:
                continue
            kind: Any = "timeout" if isinstance(exc, faults.ToolTimeout) else "error"
            return False, None, Failure(0, call.name, kind, str(exc), 0, call.tool.effect is None)
        except ToolError as exc:
            return False, None, Failure(0, call.name, "refused", str(exc), 0, call.tool.effect is None)
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class _Performed:
    """How one step ended: what the agent remembers of it, the next step, whether the step
    itself succeeded (or was seen to have landed), and whether a re-plan forgot what it did."""

    result: Any
    following: int
    succeeded: bool
    forget: bool = False


def _reread_id(op_id: str) -> str:
    # The read-back is a call of its own: "agent/task/r3" beside the step's "agent/task/3".
    head, _, tail = op_id.rpartition("/")
    return f"{head}/r{tail}" if head else f"r{op_id}"


async def _reread(
    session: ModeSession, call: ToolCall, tools: Mapping[str, ToolDef], policy: Policy,
    budget: _Budget, outcome: AgentOutcome,
) -> tuple[Any, Any]:
    """Read back what the refused write `call` changes, through the mode and against the
    budget: ("landed", what the read returned) when the write's change is there, else
    ("not_landed" | "unknown", None). No read to do it with (the tool has no `reread`):
    ("unknown", None), and nothing is issued or recorded."""
    hook = call.tool.reread
    check = hook(dict(call.args)) if hook is not None else None
    if check is None or check.tool not in tools:
        return "unknown", None
    outcome.reactions.append(Reaction.REREAD.value)
    read = ToolCall(tools[check.tool], dict(check.args), op_id=_reread_id(call.op_id))
    ok, result, _ = await _deliver(session, read, policy, budget)
    if not ok:
        return "unknown", None
    return ("landed", result) if check.landed(result) else ("not_landed", None)


async def _perform(
    session: ModeSession,
    step_at: Callable[[int, dict[str, Any], dict[str, Any] | None], ToolCall],
    index: int,
    memory: dict[str, Any],
    policy: Policy,
    budget: _Budget,
    rng: random.Random,
    tools_alt: Callable[[ToolCall, random.Random], dict[str, Any] | None],
    outcome: AgentOutcome,
    tools: Mapping[str, ToolDef],
    done: Collection[int] = (),
) -> _Performed:
    """Issue step `index` until it succeeds or the policy moves on. `done` holds the write
    steps the agent saw succeed in this attempt (a step that cannot be built goes back to the
    nearest step not among them)."""
    tries = 0
    args: dict[str, Any] | None = None
    reread: Any = None  # what reading the object back showed, once the agent did
    while True:
        try:
            call = step_at(index, memory, args)
        except (KeyError, TypeError, IndexError) as exc:
            # The step needs something an earlier step should have told it (the agent carried
            # on past a failed read): it goes back and asks again, which costs budget. With
            # no budget to bound that loop, or nothing earlier to ask, it gives up instead.
            back = max((i for i in range(index) if i not in done), default=None)
            if budget.max_steps is None or back is None:
                raise StepFailed(f"step {index}: nothing to build the call from ({exc!r})",
                                 restart=False) from exc
            outcome.reactions.append(Reaction.REPLAN.value)
            return _Performed(None, back, False)
        if call.tool.effect is EffectClass.IRREVERSIBLE:
            outcome.irreversible_calls += 1
        ok, result, failure = await _deliver(session, call, policy, budget)
        if ok:
            return _Performed(result, index + 1, True)
        assert failure is not None
        tries += 1
        failure = Failure(index, failure.tool, failure.kind, failure.message, tries, failure.read_only, reread)
        decision = policy.react(failure, rng)
        if decision.reaction is Reaction.REREAD:
            # Before anything else the agent looks at the object the tool says has moved on
            # (recorded only when the workload offers a read to do it with).
            reread, seen = await _reread(session, call, tools, policy, budget, outcome)
            failure = dataclasses.replace(failure, reread=reread)
            decision = policy.react(failure, rng)
            if reread == "landed" and decision.reaction is Reaction.CARRY_ON:
                outcome.reactions.append(decision.reaction.value)
                return _Performed(seen, index + 1, True)  # its own write is there
            if decision.reaction is Reaction.REREAD:
                raise AssertionError(f"{policy.name}: asked to read back twice for one refusal")
        outcome.reactions.append(decision.reaction.value)
        reaction = decision.reaction
        if reaction is Reaction.RETRY:
            continue
        if reaction is Reaction.ALTER:
            args = tools_alt(call, rng)  # None: nothing plausible to change, so the same call
            continue
        if reaction is Reaction.CARRY_ON:
            return _Performed({"error": failure.message}, index + 1, False)
        if reaction is Reaction.REPLAN:
            assert decision.to_step is not None
            return _Performed(None, decision.to_step, False, decision.forget)
        raise StepFailed(
            f"{call.name}: {failure.message}",
            decision.source,
            permanent=decision.permanent,
            restart=reaction is Reaction.RESTART,
        )


async def settle_attempt(
    session: ModeSession, task: Task, outcome: AgentOutcome, tx_attempt: int
) -> bool:
    """End an attempt whose plan ran: drop it (the task's veto or abort source) or commit it.
    Returns whether it committed; an abort by the mode raises Aborted. Every agent kind ends
    its attempts here, so they are judged by the same rule."""
    stop = task.abort_source or (AbortSource.PRE_COMMIT_VETO if task.veto else None)
    if stop is not None:
        await session.abort(stop, "the agent dropped the plan before commit")
        outcome.vetoed = True
        outcome.aborts.append(stop.value)
        return False
    await session.commit()
    outcome.committed = True
    outcome.committed_attempt = tx_attempt
    outcome.failure = None
    return True


async def abort_on_stop(session: ModeSession, outcome: AgentOutcome, source: AbortSource, reason: str) -> None:
    """The agent stopped its attempt: abort the transaction with `source` and record the abort
    (the mode's own abort source when aborting raised Aborted). Every agent kind stops here."""
    try:
        await session.abort(source, reason)
        outcome.aborts.append(source.value)
    except Aborted as again:
        outcome.aborts.append(again.source.value)


async def run_agent(
    trial: TrialMode,
    make_ctx: Callable[[int], AgentContext],
    task: Task,
    tools: Mapping[str, ToolDef],
    policy: AgentPolicy,
    rng: random.Random,
    behaviour: Policy | None = None,
    reactions: random.Random | None = None,
) -> AgentOutcome:
    """Run `task` to commit (or give up) under the trial's mode.

    `behaviour` decides how the agent reacts to failed calls (default: the gold policy with
    `policy`'s knobs), drawing from `reactions` (default: `rng`). A step budget, when set, counts every tool call the agent issues,
    repeated ones included, as tau2 counts them. Within an attempt, a re-plan does not
    re-issue a write the agent saw succeed, unless the policy says it forgot.
    """
    if behaviour is None:
        behaviour = GoldPolicy(policy.step_retries, policy.tool_errors_fatal)
    outcome = AgentOutcome(agent="", task_id=task.task_id)
    budget = _Budget(behaviour.max_steps)
    draws = reactions if reactions is not None else rng
    writes = [i for i, step in enumerate(task.steps) if tools[step.tool].effect is not None]
    mistake: Mistake | None = behaviour.mistake(writes, draws)
    is_write = set(writes)
    if mistake is not None:
        outcome.mistake = mistake.kind
    wrong: dict[str, Any] = {}  # the mistaken step's wrong arguments, fixed once drawn
    resume: tuple[int, dict[str, Any]] | None = None
    ctx: AgentContext | None = None
    tx_attempt = 0  # the transaction's identity; a checkpoint resume continues the same one
    done: dict[int, Any] = {}  # write steps the agent saw succeed in this transaction

    def alternative(call: ToolCall, rng: random.Random) -> dict[str, Any] | None:
        alt = call.tool.alternatives
        return alt(ctx.env, dict(call.args), rng) if alt is not None and ctx is not None else None

    def slipped(index: int, memory: dict[str, Any]) -> dict[str, Any] | None:
        """The wrong arguments of the mistaken step (None: not that step, or nothing
        plausible to change, which makes the mistake a stop)."""
        if mistake is None or mistake.kind != "alter" or index != mistake.step:
            return None
        if "args" not in wrong:
            step = task.steps[index]
            right = step.args(memory) if callable(step.args) else dict(step.args)
            alt = tools[step.tool].alternatives
            wrong["args"] = (alt(ctx.env, dict(right), random.Random(mistake.seed))
                             if alt is not None and ctx is not None else None)
            if wrong["args"] is None:
                outcome.mistake = "stop"
        return wrong["args"]

    def stops_at(index: int) -> bool:
        return mistake is not None and index == mistake.step and (
            mistake.kind == "stop" or wrong.get("args", True) is None)

    while outcome.attempts < policy.max_attempts:
        outcome.attempts += 1
        if resume is None:
            tx_attempt += 1
            done = {}
        ctx = make_ctx(tx_attempt)
        outcome.agent = ctx.agent
        ctx.extra["declared_scopes"] = declared_scopes(task, tools, ctx.env)
        session = trial.session(ctx)
        start, memory = (0, {}) if resume is None else (resume[0], dict(resume[1]))

        def step_at(
            index: int, memory: dict[str, Any], args: dict[str, Any] | None, *, prefix: str = "",
            ctx: AgentContext = ctx,
        ) -> ToolCall:
            step = task.steps[index]
            if args is None and not prefix:
                args = slipped(index, memory)
            if args is None:
                args = step.args(memory) if callable(step.args) else dict(step.args)
            return ToolCall(tools[step.tool], args, op_id=f"{ctx.agent}/{task.task_id}/{prefix}{index}")

        def validate_at(
            index: int, memory: dict[str, Any], args: dict[str, Any] | None
        ) -> ToolCall:
            return step_at(index, memory, args, prefix="v")

        try:
            await session.begin()
            index = start
            while index < len(task.steps):
                if index in done:
                    # A re-plan came back past a write the agent saw succeed: it does not
                    # issue it again (it is in its memory already).
                    index += 1
                    session.checkpoint(index, memory)
                    continue
                if mistake is not None and index == mistake.step:
                    try:
                        slipped(index, memory)
                    except (KeyError, TypeError, IndexError):
                        pass  # building the call meets the same gap, and goes back for it
                    if stops_at(index):
                        break  # it answers the user as if the task were done
                lo, hi = policy.plan_delay_ms
                if hi > 0:
                    await Sleep(rng.uniform(lo, hi))
                step = task.steps[index]
                performed = await _perform(
                    session, step_at, index, memory, behaviour, budget, draws, alternative, outcome,
                    tools, done,
                )
                if performed.forget:
                    done.clear()
                if performed.succeeded and index in is_write:
                    done[index] = performed.result
                if performed.following > index:
                    memory[step.save_as or f"step{index}"] = performed.result
                    session.checkpoint(performed.following, memory)
                index = performed.following
            for index in task.validate:
                step = task.steps[index]
                again = await _perform(
                    session, validate_at, index, memory, behaviour, budget, draws, alternative, outcome,
                    tools,
                )
                if not again.succeeded:
                    # The re-check itself failed: the agent cannot tell whether its read is
                    # stale, so this is a tool failure, not a stale read.
                    raise StepFailed(f"step {index}: the re-check before commit failed")
                if again.result != memory[step.save_as or f"step{index}"]:
                    detail = f"step {index} reads something else now"
                    await session.abort(AbortSource.STALE_READ, detail)
                    raise Aborted(AbortSource.STALE_READ, detail, retryable=False)
            if await settle_attempt(session, task, outcome, tx_attempt):
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
            outcome.out_of_budget = exc.out_of_budget
            await abort_on_stop(session, outcome, exc.source, str(exc))
            if not exc.restart:
                break
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
    outcome.steps = budget.used
    outcome.finished_at_ms = ctx.clock.now
    return outcome
