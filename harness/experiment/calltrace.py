"""What the agents asked of their mode, call by call, when a trial is traced (`atomix show`,
`atomix view`).

The trial record keeps counts; a traced replay also keeps this log: each attempt's begin,
every call the agent made through the mode (tool, arguments, effect class, result or error,
virtual time, time spent blocked), the agent policy's reaction to each failed call, and how
each attempt ended (commit, with the time it waited, or abort, with its source). It is taken
by wrapping the trial's mode and the agent's policy: the wrappers pass every call through
unchanged and only write down what they saw, so a traced trial gives the same record as an
untraced one (`atomix show` checks this on every replay).

Nothing here reads the fault injector; the injected faults come from its own records.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

from harness.modes.base import Aborted, AgentContext, ModeSession, TrialMode
from harness.world import faults
from harness.world.clock import VirtualClock
from harness.world.tooling import ToolCall, ToolError

__all__ = ["CallLog", "TracingMode", "TracingPolicy", "jsonable"]

#: A result longer than this (as JSON) is cut: a timeline reads the gist, the DB diff the rest.
MAX_RESULT_CHARS = 4000


def jsonable(value: Any, limit: int = MAX_RESULT_CHARS) -> Any:
    """`value` as plain JSON data (unknown objects by `repr`); a text longer than `limit`
    characters as JSON is returned as that text cut, with a marker."""
    try:
        text = json.dumps(value, sort_keys=True, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):
        text = json.dumps(repr(value))
    if len(text) > limit:
        return {"truncated": text[:limit], "chars": len(text)}
    return json.loads(text)


def _round(ms: float) -> float:
    return round(ms, 3) if math.isfinite(ms) else ms


class CallLog:
    """The events of one traced trial, in the order they happened on the virtual clock.

    Every event is a dict with `t_ms` (virtual time), `agent`, `attempt` and `kind`: `begin`,
    `call`, `reaction`, `commit`, `abort`. A call, commit or abort also has `faults_from` and
    `faults_to` (the fault injector's event ordinals it spanned) and `ops_from`/`ops_to` (the
    op log's length before and after), so an injected fault (its record's `index`) and each
    substrate operation are placed on the step of its agent during which they happened. Guarantees: JSON-ready, deterministic for a given trial (no
    wall clock in it)."""

    def __init__(
        self, clock: VirtualClock, position: Callable[[], tuple[int, int]] = lambda: (0, 0)
    ) -> None:
        self.clock = clock
        self.position = position
        self.events: list[dict[str, Any]] = []

    def mark(self, end: str) -> dict[str, int]:
        """`faults_<end>` and `ops_<end>`: where the injector's events and the op log are."""
        faults_at, ops_at = self.position()
        return {f"faults_{end}": faults_at, f"ops_{end}": ops_at}

    def add(self, ctx: AgentContext | None, kind: str, **fields: Any) -> dict[str, Any]:
        event: dict[str, Any] = {"t_ms": _round(self.clock.now), "kind": kind}
        if ctx is not None:
            event["agent"] = ctx.agent
            event["attempt"] = ctx.attempt
        event.update(fields)
        self.events.append(event)
        return event

    def last_failed_call(self, tool: str) -> dict[str, Any] | None:
        for event in reversed(self.events):
            if event["kind"] == "call" and event.get("error") is not None and event["tool"] == tool:
                return event
        return None


def _error(exc: BaseException) -> dict[str, Any]:
    """How a failed call looked to the agent (what a real caller sees: never a fault class)."""
    if isinstance(exc, faults.ToolTimeout):
        kind = "timeout"
    elif isinstance(exc, faults.ToolFault):
        kind = "error"
    elif isinstance(exc, ToolError):
        kind = "refused"
    elif isinstance(exc, Aborted):
        kind = f"aborted ({exc.source.value})"
    else:
        kind = type(exc).__name__
    return {"kind": kind, "message": str(exc)}


class TracingSession:
    """A mode session that logs what passes through it and changes nothing."""

    def __init__(self, inner: ModeSession, ctx: AgentContext, log: CallLog) -> None:
        self._inner = inner
        self._ctx = ctx
        self._log = log

    def __getattr__(self, name: str) -> Any:
        # Anything the agent reads of its session (restarts_after_abort, reported_residue...).
        return getattr(self._inner, name)

    async def begin(self) -> None:
        self._log.add(self._ctx, "begin", tx=self._ctx.trace)
        await self._inner.begin()

    async def call(self, call: ToolCall) -> Any:
        ctx = self._ctx
        effect = call.tool.effect.value if call.tool.effect is not None else "read"
        start, blocked = self._log.clock.now, ctx.blocked_ms
        event = self._log.add(ctx, "call", op=call.op_id, tool=call.name, effect=effect,
                              args=jsonable(dict(call.args)), result=None, error=None,
                              **self._log.mark("from"))
        try:
            result = await self._inner.call(call)
        except BaseException as exc:
            event["error"] = _error(exc)
            raise
        else:
            event["result"] = jsonable(result)
            return result
        finally:
            event["duration_ms"] = _round(self._log.clock.now - start)
            event["blocked_ms"] = _round(ctx.blocked_ms - blocked)
            event.update(self._log.mark("to"))

    async def commit(self) -> None:
        ctx = self._ctx
        start, blocked = self._log.clock.now, ctx.blocked_ms
        event = self._log.add(ctx, "commit", outcome=None, **self._log.mark("from"))
        try:
            await self._inner.commit()
        except Aborted as exc:
            event["outcome"] = "aborted"
            event["source"] = exc.source.value
            event["detail"] = exc.detail
            raise
        else:
            event["outcome"] = "committed"
        finally:
            event["duration_ms"] = _round(self._log.clock.now - start)
            event["blocked_ms"] = _round(ctx.blocked_ms - blocked)
            event.update(self._log.mark("to"))

    async def abort(self, source: Any, detail: str = "") -> None:
        event = self._log.add(self._ctx, "abort", source=str(getattr(source, "value", source)),
                              detail=detail, **self._log.mark("from"))
        start = self._log.clock.now
        try:
            await self._inner.abort(source, detail)
        finally:
            event["duration_ms"] = _round(self._log.clock.now - start)
            event.update(self._log.mark("to"))

    def checkpoint(self, step: int, memory: dict[str, Any]) -> None:
        self._inner.checkpoint(step, memory)

    def restore(self) -> tuple[int, dict[str, Any]] | None:
        return self._inner.restore()


class TracingMode:
    """A trial's mode whose sessions log into a `CallLog` (see `TracingSession`)."""

    def __init__(self, inner: TrialMode, log: CallLog) -> None:
        self._inner = inner
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def session(self, ctx: AgentContext) -> Any:
        return TracingSession(self._inner.session(ctx), ctx, self._log)


class TracingPolicy:
    """An agent policy whose every decision on a failed call is logged against that call.

    The agent decides right after the failed call returns, with no await in between, so the
    latest failed call of the tool is the one the decision answers."""

    def __init__(self, inner: Any, log: CallLog) -> None:
        self._inner = inner
        self._log = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def react(self, failure: Any, rng: random.Random) -> Any:
        decision = self._inner.react(failure, rng)
        call = self._log.last_failed_call(str(failure.tool))
        fields: dict[str, Any] = {
            "reaction": decision.reaction.value,
            "tool": failure.tool,
            "step": failure.step,
            "tries": failure.tries,
            "answers": call["op"] if call else None,
        }
        if failure.reread is not None:
            fields["reread"] = failure.reread
        if decision.to_step is not None:
            fields["to_step"] = decision.to_step
        event = self._log.add(None, "reaction", **fields)
        if call is not None:
            event["agent"], event["attempt"] = call.get("agent"), call.get("attempt")
        return decision


def wrap_loop(loop: Any, log: CallLog) -> Callable[[], None]:
    """Log `loop`'s policy decisions (a scripted loop's `behaviour`); returns an undo."""
    behaviour = getattr(loop, "behaviour", None)
    if behaviour is None:
        return lambda: None
    loop.behaviour = TracingPolicy(behaviour, log)

    def undo() -> None:
        loop.behaviour = behaviour

    return undo
