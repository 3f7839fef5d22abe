"""The LLM agent of the harness: a real model behind an OpenAI-compatible endpoint (OpenAI,
vLLM, llama.cpp's server) plans and calls the workload's tools (`agent.kind: llm`).

tau2's solo style: the system prompt is tau2's solo instructions with the domain policy
(`system_prompt: tau2`, the default) or a few lines for small models (`short`, which also ends
the ticket with "Call a function."); the task's ticket is the user message (the workload's:
tau2's `ticket` field where a task has one; tau2's retail tasks have none, so the retail
workload gives the customer's reason for the call and what they know and do not, never the
user simulator's private task instructions); the workload's tools are
offered with their JSON schemas (`atomix.schemas`). Each tool call the model makes
becomes a harness `ToolCall` delivered through the mode's session, so faults are injected
below the mode exactly as for every agent. Results go back to the model as tool messages (as
user messages naming the call with `tool_result_role: user`, for chat templates without a
tool role), and so do errors: the tool's refusal, an injected fault as the caller sees it
(an error or a time-out, never its class), an unknown tool, arguments that are not a JSON
object.

Budget: `agent.max_steps` counts the tool calls the model issues (tau2's max_steps),
invalid ones and those of restarted attempts included.

Ending: the conversation ends when the model answers without a tool call; then the agent
commits (a task's pre-commit veto aborts instead). When the budget runs out first, or the
server refuses the conversation (HTTP 400, e.g. it outgrew the context window), the task is
unfinished and its transaction aborts, as the scripted agent's does when its budget runs
out.

Time-outs: a request with no answer within `agent.request_timeout_s` (default 120 s) is a
failed step: it counts as one step against max_steps, the record lists it under
`llm.failed_requests` and says `llm.stop: timeout`, and the task ends unfinished (its
transaction aborts) while the trial completes and is recorded. The model gets nothing back
for that turn, and the conversation is not asked again: at temperature 0 the same request
would take as long again. The time-out is cached with its length, like an answer: the same
request in another mode, or in a rerun, fails at once instead of queueing behind a server
still busy with it (llama.cpp's server finishes what a client gave up on, and its
chatml-function-calling handler ignores max_tokens); a run with a longer
agent.request_timeout_s asks again, and an answer then replaces the cached time-out. Which
requests time out depends on the machine, so a fresh cache on another machine may record
other outcomes. The request runs in a helper thread that the caller
waits for in short slices, so Ctrl-C interrupts a run in the middle of a request at once.

Progress: `set_request_progress` installs a callback that hears of every request sent to the
server (its start, every 15 s of waiting, its end with tokens and seconds, a time-out);
`atomix run` prints them (harness.cli.progress) unless --quiet.

Aborts by the mode: a non-retryable one ends the task. After a retryable one (a stale read,
a time-out) the agent starts a fresh attempt: a new transaction and a fresh conversation
from the ticket, as if restarted (the mode undid or never released the aborted attempt's
effects). A mode that resumes from a checkpoint (`checkpoint-replay`) gets the conversation
as it stood after the last completed turn, and the agent goes on from there. An attempt has
its own conversation in the record.

Op ids: a call's op id is `<agent>/<task>/<n>`, n the ordinal of the first call of this
attempt with the same tool and arguments: the model repeating a call is the same logical
call retried, as a scripted agent's retry of a step is, so a duplicate application shows in
the oracle's count.

Determinism: completions are cached on disk by request hash (`harness.agents.llm_cache`), so a
repeated or resumed run makes no second call and gets the same records. Wall-clock latency
is the only thing that differs between runs, and it goes to the record's `timings`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from atomix.effects import AbortSource, EffectClass
from harness.agents.llm_client import (
    ModelClient,
    ModelError,
    RequestEvent,
    RequestTimedOut,
    set_request_progress,
    wire_messages,
)
from harness.agents.policies import AgentConfig
from harness.agents.task import AgentOutcome, AgentPolicy, Task, abort_on_stop, settle_attempt
from harness.errors import RunError
from harness.modes.base import Aborted, AgentContext, ModeSession, TrialMode
from harness.world import faults
from harness.world.clock import Sleep
from harness.world.tooling import ToolCall, ToolDef, ToolError

__all__ = [
    "LLM_METRICS",
    "Briefing",
    "LlmOutcome",
    "ModelClient",
    "ModelError",
    "RequestEvent",
    "RequestTimedOut",
    "briefing",
    "set_request_progress",
    "run_llm_agent",
    "wire_messages",
]


#: The metrics every record of an `agent.kind: llm` run has (LlmLoop.metrics): requests sent,
#: tokens read and written, requests that timed out.
LLM_METRICS = ("llm_requests", "llm_prompt_tokens", "llm_completion_tokens", "llm_timeouts")


_TAU2_INSTRUCTIONS = """\
You are a customer service agent that helps the user according to the <policy> provided below.
You will be provided with a ticket that contains the user's request.
You will need to plan and call the appropriate tools to solve the ticket.
You cannot communicate with the user, only make tool calls.
Stop when you consider that you have solved the ticket: reply with a short summary for the
user and no tool call.
Always follow the policy. Always make sure you generate valid JSON only."""

_SHORT_PROMPT = """\
You are a retail customer service agent. Resolve the user's ticket by calling tools; you \
cannot talk to the user. First find the user id (by email, or by name and zip), then read the orders and products you need, then \
make the change the ticket asks for. Order ids start with '#'. When done, reply with a \
one-line summary and no tool call."""


@dataclass(frozen=True)
class Briefing:
    """What the model is told before a task: the system prompt and the offered tools (OpenAI
    tools format, names of the workload's tools)."""

    system: str
    tools: tuple[dict[str, Any], ...]
    nudge: str = ""  # appended to the ticket

    def opening(self, ticket: str) -> list[dict[str, Any]]:
        """A fresh conversation about `ticket`."""
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": ticket + self.nudge}]


def briefing(
    config: AgentConfig, workload: str, tasks: Sequence[Task], tool_schemas: Sequence[Any],
    domain_policy: str, tools: Mapping[str, ToolDef],
) -> Briefing:
    """The briefing for a scenario; RunError when the workload gives the model nothing to go
    on (a task without a ticket, no tool schemas) or offers a tool it does not have."""
    if not tool_schemas or any(not t.ticket for t in tasks):
        raise RunError(
            f"agent.kind llm: workload {workload!r} gives its tasks no ticket (the request a "
            "solo agent acts on) or offers no tool schemas, so a model has nothing to act on; "
            "use agent.kind gold, llm-like or noop with it, or a workload with tickets "
            "(tau_retail)"
        )
    unknown = sorted(s.name for s in tool_schemas if s.name not in tools)
    if unknown:
        raise RunError(f"workload {workload!r} offers tools it does not have: {unknown}")
    tools_offered = tuple(s.openai() for s in tool_schemas)
    if config.system_prompt == "tau2":
        system = f"<instructions>\n{_TAU2_INSTRUCTIONS}\n</instructions>\n<policy>\n{domain_policy.strip()}\n</policy>"
        return Briefing(system, tools_offered)
    # A small model told only the ticket tends to answer it in words at once (Gemma 3 270M
    # did on every tau2 retail ticket tried); a last line asking for a call gets it to act.
    return Briefing(_SHORT_PROMPT, tools_offered, "\n\nCall a function.")


@dataclass(slots=True)
class LlmOutcome(AgentOutcome):
    """An LLM agent's outcome plus its transcript: every attempt's conversation, every tool
    call with what became of it, token usage, and per request its latency (wall clock, for
    the record's timings) and whether the cache answered it."""

    conversations: list[list[dict[str, Any]]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(
        default_factory=lambda: {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
    )
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Requests that got no answer in time: {"attempt", "step", "error"} (see the module).
    failed_requests: list[dict[str, Any]] = field(default_factory=list)
    # why the last conversation ended: answered, out_of_budget, model_error, timeout, aborted
    stop: str = ""

    def record(self) -> dict[str, Any]:
        """The transcript for the trial record (no clock in it; deterministic unless a
        request timed out)."""
        return {"llm": {"stop": self.stop, "usage": dict(self.usage),
                        "tool_calls": self.tool_calls, "conversations": self.conversations,
                        "failed_requests": self.failed_requests}}

    def messages_to_user(self) -> list[str]:
        """The text of every assistant message of every attempt (what tau2's COMMUNICATE
        check reads)."""
        return [str(m["content"]) for c in self.conversations for m in c
                if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"]]

    def tools_called(self) -> list[str]:
        """The names of the tools whose calls succeeded."""
        return [str(c["name"]) for c in self.tool_calls if c.get("outcome") == "ok"]

    def timings(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "latency_s": sum(r["latency_s"] for r in self.requests),
            "cached": sum(r["cached"] for r in self.requests),
            "requests": self.requests,
        }


class _Stop(Exception):
    """The agent stops the task unfinished: its budget ran out, or the model cannot go on."""

    def __init__(self, message: str, *, out_of_budget: bool) -> None:
        super().__init__(message)
        self.out_of_budget = out_of_budget


def _content(result: Any) -> str:
    """A tool result as the text of a tool message (tau2: strings as they are, else JSON)."""
    if isinstance(result, str):
        return result
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        result = dataclasses.asdict(result)  # e.g. an Ack of a staged or queued effect
    return json.dumps(result, ensure_ascii=False, default=str)


def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(arguments, None), or (None, what is wrong with them)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        return None, f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(args, dict):
        return None, f"the arguments must be a JSON object, got {type(args).__name__}"
    return args, None


class _Attempt:
    """One attempt's tool execution: op ids, budget, the session, what the record keeps."""

    def __init__(
        self, session: ModeSession, ctx: AgentContext, task: Task, tools: Mapping[str, ToolDef],
        offered: frozenset[str], outcome: LlmOutcome, wrapper_retries: int,
    ) -> None:
        self.session, self.ctx, self.task, self.tools = session, ctx, task, tools
        self.offered, self.outcome, self.wrapper = offered, outcome, wrapper_retries
        self.ordinals: dict[str, int] = {}

    def op_id(self, name: str, args: Mapping[str, Any]) -> str:
        same = json.dumps([name, args], sort_keys=True, ensure_ascii=False, default=str)
        n = self.ordinals.setdefault(same, len(self.ordinals))
        return f"{self.ctx.agent}/{self.task.task_id}/{n}"

    async def execute(self, tool_call: Mapping[str, Any]) -> str:
        """Deliver one tool call of the model; the text the model gets back. Raises Aborted
        when the mode aborts the transaction."""
        function = tool_call.get("function") or {}
        name = str(function.get("name"))
        entry: dict[str, Any] = {"attempt": self.outcome.attempts, "id": tool_call.get("id"),
                                 "name": name, "arguments": function.get("arguments")}
        self.outcome.tool_calls.append(entry)
        if name not in self.offered:
            entry["outcome"] = "unknown_tool"
            return f"Error: unknown tool {name!r}; the tools are: {', '.join(sorted(self.offered))}"
        args, problem = _arguments(function.get("arguments"))
        if args is None:
            entry["outcome"] = "bad_arguments"
            return f"Error: {problem}"
        entry["arguments"] = args
        call = ToolCall(self.tools[name], args, op_id=self.op_id(name, args))
        entry["op"] = call.op_id
        if call.tool.effect is EffectClass.IRREVERSIBLE:
            self.outcome.irreversible_calls += 1
        for retry in range(self.wrapper + 1):
            try:
                result = await self.session.call(call)
            except faults.ToolFault as exc:
                if retry < self.wrapper:
                    continue
                entry["outcome"] = "timeout" if isinstance(exc, faults.ToolTimeout) else "error"
                return f"Error: {exc}"
            except ToolError as exc:
                entry["outcome"] = "refused"
                return f"Error: {exc}"
            except Aborted as exc:
                entry["outcome"] = "aborted"
                raise exc
            entry["outcome"] = "ok"
            return _content(result)
        raise AssertionError("unreachable")


async def run_llm_agent(
    trial: TrialMode,
    make_ctx: Callable[[int], AgentContext],
    task: Task,
    tools: Mapping[str, ToolDef],
    policy: AgentPolicy,
    rng: Any,
    config: AgentConfig,
    brief: Briefing,
    client: ModelClient,
    *,
    wrapper_retries: int = 0,
) -> LlmOutcome:
    """Run `task` with the model under the trial's mode: converse until the model answers
    (then commit) or the budget runs out (then abort); see the module docstring."""
    assert task.ticket is not None and config.max_steps is not None
    outcome = LlmOutcome(agent="", task_id=task.task_id)
    offered = frozenset(t["function"]["name"] for t in brief.tools)
    used = 0
    resume: list[dict[str, Any]] | None = None
    tx_attempt = 0
    ctx: AgentContext | None = None
    while outcome.attempts < policy.max_attempts:
        outcome.attempts += 1
        if resume is None:
            tx_attempt += 1
        ctx = make_ctx(tx_attempt)
        outcome.agent = ctx.agent
        # A model has no plan up front: it declares only what the task itself declares, and
        # lock-up-front modes lock the rest as it goes.
        ctx.extra["declared_scopes"] = sorted(task.footprint)
        session = trial.session(ctx)
        messages = resume if resume is not None else brief.opening(task.ticket)
        resume = None
        outcome.conversations.append(messages)
        attempt = _Attempt(session, ctx, task, tools, offered, outcome, wrapper_retries)
        try:
            await session.begin()
            while True:
                lo, hi = policy.plan_delay_ms
                if hi > 0:
                    await Sleep(rng.uniform(lo, hi))
                report = functools.partial(
                    RequestEvent, agent=ctx.agent, task=task.task_id,
                    request=outcome.usage["requests"] + 1, step=used, max_steps=config.max_steps)
                try:
                    reply = client.complete(messages, brief.tools, report)
                except ModelError as exc:
                    outcome.stop = "model_error"
                    raise _Stop(f"the model server refused the conversation: {exc}",
                                out_of_budget=False) from None
                except RequestTimedOut as exc:
                    # A failed step: it costs one of max_steps, the model gets nothing back,
                    # and the task ends unfinished (asked again, it would time out again).
                    used += 1
                    outcome.usage["requests"] += 1
                    outcome.requests.append({
                        "latency_s": 0.0 if exc.cached else config.request_timeout_s,
                        "cached": exc.cached, "timeout": True})
                    outcome.failed_requests.append(
                        {"attempt": outcome.attempts, "step": used, "error": str(exc)})
                    outcome.stop = "timeout"
                    raise _Stop(str(exc), out_of_budget=False) from None
                outcome.requests.append({"latency_s": reply.latency_s, "cached": reply.cached})
                outcome.usage["requests"] += 1
                for key in ("prompt_tokens", "completion_tokens"):
                    outcome.usage[key] += int(reply.usage.get(key, 0))
                messages.append(copy.deepcopy(reply.message))
                calls = reply.message.get("tool_calls") or []
                if not calls:
                    outcome.stop = "answered"
                    break
                for tool_call in calls:
                    if used >= config.max_steps:
                        outcome.stop = "out_of_budget"
                        raise _Stop(f"step budget of {config.max_steps} tool calls exhausted",
                                    out_of_budget=True)
                    used += 1
                    text = await attempt.execute(tool_call)
                    messages.append({"role": "tool", "tool_call_id": tool_call.get("id"),
                                     "content": text})
                # At a turn's end every call has its answer: a conversation to resume from.
                session.checkpoint(used, {"messages": copy.deepcopy(messages)})
            await settle_attempt(session, task, outcome, tx_attempt)
            break
        except Aborted as exc:
            outcome.aborts.append(exc.source.value)
            outcome.stop = "aborted"
            if not exc.retryable:
                outcome.failure = str(exc)
                break
            saved = session.restore()
            if saved is not None and saved[1].get("messages"):
                resume = saved[1]["messages"]
            await Sleep(policy.replan_backoff_ms * rng.uniform(0.5, 1.5))
        except _Stop as exc:
            outcome.failure = str(exc)
            outcome.out_of_budget = exc.out_of_budget
            await abort_on_stop(session, outcome, AbortSource.TOOL_FAILURE, str(exc))
            break
        finally:
            outcome.reported_residue += getattr(session, "reported_residue", 0)
            outcome.blocked_ms += ctx.blocked_ms
            ctx.blocked_ms = 0.0
    else:
        outcome.failure = outcome.failure or f"gave up after {policy.max_attempts} attempts"
    assert ctx is not None
    outcome.steps = used
    outcome.finished_at_ms = ctx.clock.now
    return outcome


class LlmLoop:
    """`agent.kind: llm` as a trial runs it (harness.agents.loops): one briefing and one model
    client per trial, shared by its tasks; records gain each agent's conversations and token
    usage, and the trial's per-request latency goes under `timings.llm`."""

    def __init__(self, spec: Any, scenario: Any, tools: Mapping[str, ToolDef]) -> None:
        self.spec = spec
        self.tools = tools
        self.policy = scenario.policy
        self.brief = briefing(spec.agent, spec.workload, scenario.tasks, scenario.tool_schemas,
                              scenario.domain_policy, tools)
        self.client = ModelClient(spec.agent)

    async def run(
        self, trial_mode: Any, make_ctx: Callable[[int], Any], task: Task, rng: random.Random,
        reactions: random.Random,
    ) -> AgentOutcome:
        return await run_llm_agent(
            trial_mode, make_ctx, task, self.tools, self.policy, rng, self.spec.agent,
            self.brief, self.client, wrapper_retries=self.spec.agent.wrapper_retries_for(self.spec.mode))

    def metrics(self, outcomes: list[AgentOutcome]) -> dict[str, Any]:
        # Tokens the conversations took (cached answers count what they cost once).
        llm = [o for o in outcomes if isinstance(o, LlmOutcome)]
        metrics = {f"llm_{key}": sum(o.usage[key] for o in llm)
                   for key in ("requests", "prompt_tokens", "completion_tokens")}
        metrics["llm_timeouts"] = sum(len(o.failed_requests) for o in llm)
        return metrics

    def record(self, outcome: AgentOutcome) -> dict[str, Any]:
        return outcome.record()  # type: ignore[attr-defined]

    def timings(self, outcomes: list[AgentOutcome]) -> dict[str, Any]:
        # Wall-clock model latency per request (0 and cached when the cache answered).
        return {"llm": [o.timings() for o in outcomes]}  # type: ignore[attr-defined]
