"""The MCP server (stdio) that fronts the upstream server: sessions, commit and abort, the
idle time-out, signals, and recovery from a durable log (`--log`).

A transaction begins with the first call after the previous one settled, and settles by an
explicit control tool, after `timeout_s` seconds without a call (`on_timeout`), or when the
client's session ends (`on_session_end`, also on SIGTERM/SIGINT).

How the runtime is used across requests: the MCP server runs each request in its own task,
so no `async with rt.atransaction()` block can span them. The proxy keeps the `ATx` handle
that `rt.atransaction()` returns (it is begun at once) and drives it only through its public
coroutines `tx.call(tool, ...)`, `tx.commit()` and `tx.abort(source, detail)`, from whichever
request task needs them; it never enters the handle as a context manager, so the
`current_transaction` context variable is never set (nothing here needs it: `tx.call` names
the transaction explicitly). Calls and settlement are serialised by a gate: a settlement
waits for the calls in flight and holds new ones until it is done, so no call can reach a
transaction that is already sealed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Literal

import mcp.types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.server.lowlevel import Server

from atomix.coordinator.store import CoordinatorError
from atomix.decisions import Settlement
from atomix.effects import AbortSource, Effect, EffectClass
from atomix.errors import CommitIncomplete, ScopeError, TransactionAborted
from atomix.handles import ATx
from atomix.log import LogError
from atomix.recovery import RecoveryReport
from atomix.runtime import Runtime
from atomix.tools import Ack

from .policy import PolicyError, ProxyPolicy
from .report import (
    DONE,
    SettleReport,
    ack_reply,
    reply,
    say,
    settle_report,
    status_reply,
)
from .screen import screened_stdio_server
from .tools import (
    ABORT,
    COMMIT,
    STATUS,
    ProxiedTool,
    UpstreamShims,
    argument_problem,
    build_tools,
    definition_problems,
    schema_validator,
    template_name,
)

__all__ = ["ProxyStartError", "TransactionalProxy", "run_proxy", "serve"]


class ProxyStartError(RuntimeError):
    """The upstream server could not be started or listed."""


class TransactionalProxy:
    """The MCP server side of the proxy, over one upstream session and one Runtime.

    Guarantees: an irreversible or bufferable call reaches the upstream server only when its
    transaction commits, and then once (apply attempts are 1: an upstream tool does not
    honour idempotency keys, so a retry could deliver twice; a failed delivery is reported
    as `failed`); a reversible call that ran is compensated if its transaction aborts (a
    compensation that fails is reported as residue); at most one transaction is open, and
    no call runs while it settles.
    """

    def __init__(
        self,
        policy: ProxyPolicy,
        policy_path: str | os.PathLike[str],
        upstream: ClientSession,
        tools: dict[str, ProxiedTool],
        *,
        runtime: Runtime | None = None,
        upstream_name: str = "upstream",
        upstream_instructions: str | None = None,
    ) -> None:
        self.policy = policy
        self.upstream = upstream
        self.tools = tools
        self.rt = runtime or Runtime(apply_attempts=1, strict=True)
        self.upstream_name = upstream_name
        self._upstream_instructions = upstream_instructions
        self._validators = {n: schema_validator(t.offered.input_schema) for n, t in tools.items()}
        self._tasks: set[asyncio.Future[Any]] = set()
        problems = [p for entry in tools.values() for p in definition_problems(entry)]
        if problems:
            raise PolicyError(policy_path, problems)
        self._shims = UpstreamShims(self.rt, upstream, tools)
        self._tx: ATx | None = None
        self._opened_at = 0.0
        self._last_activity = 0.0
        self._last: SettleReport | None = None
        self._cond = asyncio.Condition()
        self._inflight = 0
        self._settling = False
        self._changed = asyncio.Event()
        self._stopping = False

    async def recover(self) -> RecoveryReport:
        """Finish the committed transactions a dead proxy left in the durable log (each
        undelivered effect delivered once, by key) and abort the rest (compensating their
        reversible calls), through this upstream session. The runtime's recovery is
        synchronous and drives async tools with a loop of its own, so it runs in a worker
        thread and each upstream call is handed back to this loop."""
        report = await asyncio.to_thread(self.rt.recover)
        if report.finished or report.aborted or not report.clean:
            say("\n".join(report.lines()))
        return report

    # -- the gate between calls and settlement ------------------------------------------------
    @contextlib.asynccontextmanager
    async def _call_slot(self) -> AsyncIterator[ATx]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._settling)
            self._inflight += 1
            if self._tx is None:
                opened = self.rt.atransaction(trace="mcp")
                # Never a savepoint: the proxy enters no transaction (see the module docstring).
                assert isinstance(opened, ATx)
                self._tx = opened
                self._opened_at = asyncio.get_running_loop().time()
            tx = self._tx
        self._touch()
        try:
            yield tx
        finally:
            async with self._cond:
                self._touch()  # before a waiting settlement can look at it
                self._inflight -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def _settle_slot(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._settling)
            self._settling = True
            await self._cond.wait_for(lambda: self._inflight == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._settling = False
                self._cond.notify_all()
            self._touch()

    def _touch(self) -> None:
        self._last_activity = asyncio.get_running_loop().time()
        self._changed.set()

    # -- settlement -------------------------------------------------------------------------
    async def settle(
        self,
        how: Literal["commit", "abort"],
        why: str,
        *,
        only_if: Callable[[], bool] | None = None,
        **abort: Any,
    ) -> SettleReport | None:
        """Commit or abort the open transaction (None if there is none, or if `only_if`,
        asked once no call is in flight, says no); `abort` takes the runtime's `source` and
        `detail`."""
        async with self._settle_slot():
            tx = self._tx
            if tx is None or (only_if is not None and not only_if()):
                return None
            self._tx = None
            effects = list(tx.staged.values())
            settlement: Settlement | None
            try:
                if how == "commit":
                    settlement = await tx.commit()
                else:
                    settlement = await tx.abort(
                        abort.get("source", AbortSource.PRE_COMMIT_VETO), abort.get("detail", "")
                    )
            except (CommitIncomplete, TransactionAborted) as exc:
                settlement = _settlement_of(exc)
            report = self._report(tx, effects, settlement, why)
            self._last = report
            say("\n".join(report.lines()))
            return report

    def _report(
        self, tx: ATx, effects: list[Effect], settlement: Settlement | None, why: str
    ) -> SettleReport:
        # The deliveries' answers are taken out here: each is reported once.
        delivered = {
            e.key: answer
            for e in effects
            if (answer := self._shims.delivered.pop(e.key, None)) is not None
        }
        done = settlement if settlement is not None else tx.settlement
        return settle_report(tx.txid, effects, done, why, delivered)

    async def end_session(self, why: str = "session end") -> SettleReport | None:
        """Settle what the session left open, as the policy's on_session_end says."""
        return await self.settle(
            self.policy.on_session_end, why, source=AbortSource.CANCELLED, detail="the session ended"
        )

    async def watch_idle(self) -> None:
        """Settle the open transaction (on_timeout) after timeout_s seconds without a call."""
        timeout = self.policy.timeout_s
        if timeout is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            if self._tx is None or self._inflight or self._settling:
                await self._changed.wait()
                continue
            remaining = self._last_activity + timeout - loop.time()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
                continue
            # A call may arrive while the settlement waits for the gate: then it is not idle.
            await self.settle(
                self.policy.on_timeout,
                f"idle for {timeout:g} s",
                only_if=lambda: loop.time() - self._last_activity >= timeout,
                source=AbortSource.TIMEOUT,
                detail=f"no call for {timeout:g} s",
            )

    # -- the MCP server ----------------------------------------------------------------------
    def control_tools(self) -> list[types.Tool]:
        empty: dict[str, Any] = {"type": "object", "properties": {}}
        status = types.Tool(
            name=STATUS,
            description=(
                "Say what the current Atomix transaction holds: the calls queued at the gate or "
                "staged until commit, the reversible calls that would be undone at abort, and "
                "how the last transaction settled."
            ),
            input_schema=empty,
        )
        if self.policy.boundary == "session":
            return [status]
        commit = types.Tool(
            name=COMMIT,
            description=(
                "Commit the current transaction: every call queued until commit (irreversible) "
                "or staged (bufferable) is delivered to the server now, exactly once, and the "
                "reversible calls are kept. The next call starts a new transaction."
            ),
            input_schema=empty,
        )
        abort = types.Tool(
            name=ABORT,
            description=(
                "Abort the current transaction: queued and staged calls are dropped (they never "
                "reach the server) and reversible calls are undone by their compensating tools. "
                "The next call starts a new transaction."
            ),
            input_schema={
                "type": "object",
                "properties": {"reason": {"type": "string", "description": "Why (for the log)."}},
            },
        )
        return [commit, abort, status]

    def instructions(self) -> str:
        gated = sorted(n for n, t in self.tools.items() if t.effect is EffectClass.IRREVERSIBLE)
        staged = sorted(n for n, t in self.tools.items() if t.effect is EffectClass.BUFFERABLE)
        undone = sorted(n for n, t in self.tools.items() if t.effect is EffectClass.REVERSIBLE)
        parts = [
            "Tool calls through this server are transactional (Atomix).",
            f"Queued until commit, never executed if the transaction aborts: {', '.join(gated) or 'none'}.",
            f"Staged until commit: {', '.join(staged) or 'none'}.",
            f"Executed now and undone if the transaction aborts: {', '.join(undone) or 'none'}.",
            "A read does not see writes that are still queued or staged.",
        ]
        if self.policy.boundary == "explicit":
            parts.append(
                f"Call {COMMIT} to make the work final or {ABORT} to discard it; if the session "
                f"ends first, it is {DONE[self.policy.on_session_end]}."
            )
        else:
            parts.append(
                "The session is the transaction: it is "
                f"{DONE[self.policy.on_session_end]} when the session ends."
            )
        if self.policy.timeout_s is not None:
            parts.append(
                f"After {self.policy.timeout_s:g} s without a call it is "
                f"{DONE[self.policy.on_timeout]}."
            )
        if self._upstream_instructions:
            parts.append(f"\n{self.upstream_name}: {self._upstream_instructions}")
        return " ".join(parts)

    def server(self) -> Server[Any]:
        listing = [t.offered for t in self.tools.values()] + self.control_tools()

        async def list_tools(
            ctx: Any, params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=listing)

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self.call(params.name, params.arguments or {})

        return Server(
            f"atomix-proxy:{self.upstream_name}",
            instructions=self.instructions(),
            on_list_tools=list_tools,
            on_call_tool=call_tool,
        )

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """One client call: a control tool, or an upstream tool through the transaction."""
        if name == STATUS:
            return self.status()
        if name in (COMMIT, ABORT) and self.policy.boundary == "explicit":
            return await self._control(name, arguments)
        entry = self.tools.get(name)
        if entry is None:
            return reply(f"unknown tool {name!r}", error=True)
        problem = argument_problem(entry, arguments, self._validators[name])
        if problem is not None:
            return reply(f"{name}: rejected, nothing ran: {problem}", error=True)
        kwargs = {template_name(a): v for a, v in arguments.items()}
        shim = self._shims[name]
        try:
            shim.spec.bind((), kwargs)
        except TypeError as exc:
            return reply(f"{name}: rejected, nothing ran: {exc}", error=True)
        async with self._call_slot() as tx:
            before = set(tx.staged)
            try:
                out = await tx.call(shim, **kwargs)
            except TransactionAborted as exc:
                # The runtime settled it (its effects are dropped or compensated): say how,
                # and let the next call begin a new one.
                if self._tx is tx:
                    self._tx = None
                    self._last = self._report(tx, [], _settlement_of(exc), f"{name} failed")
                return reply(f"{name}: the transaction aborted: {exc}", error=True)
            except ScopeError as exc:
                return reply(f"{name}: rejected, nothing ran: {exc}", error=True)
            except Exception as exc:  # noqa: BLE001 - reported to the client, as a tool error
                more = ""
                if entry.effect is EffectClass.REVERSIBLE:
                    more = " It may have acted upstream; it is compensated if this transaction aborts."
                return reply(f"{name}: the upstream call failed: {exc}.{more}", error=True)
        if isinstance(out, Ack):
            return ack_reply(
                entry.name,
                out,
                explicit=self.policy.boundary == "explicit",
                duplicate=out.key in before,
            )
        return types.CallToolResult.model_validate(out)

    async def _control(self, name: str, arguments: Mapping[str, Any]) -> types.CallToolResult:
        if name == COMMIT:
            report = await self.settle("commit", COMMIT)
        else:
            reason = str(arguments.get("reason") or "")
            report = await self.settle(
                "abort", ABORT, source=AbortSource.PRE_COMMIT_VETO, detail=reason or ABORT
            )
        if report is None:
            return reply("no open transaction: nothing to settle", data={"transaction": None})
        failed = (name == COMMIT and report.outcome != "committed") or not report.clean
        return reply("\n".join(report.lines()), error=failed, data=report.data())

    def status(self) -> types.CallToolResult:
        tx = self._tx
        if tx is None:
            return status_reply(None, self._last)
        loop = asyncio.get_running_loop()
        idle: tuple[str, float] | None = None
        if self.policy.timeout_s is not None:
            left = self.policy.timeout_s - (loop.time() - self._last_activity)
            idle = (self.policy.on_timeout, left)
        return status_reply(tx, self._last, age_s=loop.time() - self._opened_at, idle=idle)

    # -- stopping ------------------------------------------------------------------------------
    def on_signal(self, signum: int) -> None:
        """The event loop's signal handler: stop in a task (see stop_on_signal)."""
        task = asyncio.ensure_future(self.stop_on_signal(signum))
        self._tasks.add(task)  # a task nobody references may be collected before it runs

    async def stop_on_signal(self, signum: int) -> None:
        """SIGTERM/SIGINT: settle as at session end, then leave at once (the transport's
        stdin reader cannot be cancelled, so waiting for it could wait forever)."""
        if self._stopping:
            return
        self._stopping = True
        name = signal.Signals(signum).name
        try:
            await self.end_session(f"session end by {name}")
        finally:
            self.rt.close()
            say(f"stopped by {name}")
            os._exit(128 + signum)


def _settlement_of(exc: CommitIncomplete | TransactionAborted) -> Settlement | None:
    """The settlement an exception of the runtime carries (the errors type it loosely)."""
    return exc.settlement if isinstance(exc.settlement, Settlement) else None


async def _list_upstream(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def _find(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of `kinds` in `exc` (task groups wrap them in groups)."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kinds)
            if found is not None:
                return found
    return None


async def serve(
    policy: ProxyPolicy,
    policy_path: str | os.PathLike[str],
    command: Sequence[str],
    *,
    log_dir: str | os.PathLike[str] | None = None,
    coordinator: str | None = None,
) -> None:
    """Start the upstream server, check the policy against its tools, then serve the client
    on this process's stdin/stdout until it disconnects, and settle what is left. With a
    `coordinator` URL, proxies on it isolate their calls against each other's."""
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=dict(os.environ))
    started = False
    try:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as upstream:
            try:
                init = await upstream.initialize()
                listed = await _list_upstream(upstream)
            except Exception as exc:  # noqa: BLE001 - any failure here means it did not start
                raise ProxyStartError(
                    f"upstream server {' '.join(command)!r} did not start as an MCP server: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            started = True
            tools = build_tools(policy, policy_path, listed)
            try:
                # Recovery waits until the tools exist: what a dead proxy left is finished or
                # compensated through the upstream server (see TransactionalProxy.recover).
                runtime = Runtime(
                    apply_attempts=1, strict=True, log=log_dir, recover=False, coordinator=coordinator
                )
            except (LogError, ValueError) as exc:  # (ValueError: --log coordinator without one)
                raise ProxyStartError(f"--log {log_dir}: {exc}") from exc
            except CoordinatorError as exc:
                raise ProxyStartError(f"--coordinator: {exc}") from exc
            proxy = TransactionalProxy(
                policy,
                policy_path,
                upstream,
                tools,
                runtime=runtime,
                upstream_name=init.server_info.name,
                upstream_instructions=init.instructions,
            )
            if runtime.log is not None:
                await proxy.recover()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, proxy.on_signal, signum)
            watcher = asyncio.ensure_future(proxy.watch_idle())
            server = proxy.server()
            try:
                # Screened: a line that is no JSON-RPC message is answered with its error.
                async with screened_stdio_server() as (client_read, client_write):
                    await server.run(client_read, client_write, server.create_initialization_options())
                await proxy.end_session()
            finally:
                watcher.cancel()
                runtime.close()
    except OSError as exc:
        if started:
            raise
        raise ProxyStartError(f"cannot start upstream server {command[0]!r}: {exc}") from exc
    except BaseExceptionGroup as group:
        found = _find(group, (PolicyError, ProxyStartError))
        if found is not None:
            raise found from None
        raise


def run_proxy(
    policy: ProxyPolicy,
    policy_path: str | os.PathLike[str],
    command: Sequence[str],
    *,
    log_dir: str | os.PathLike[str] | None = None,
    coordinator: str | None = None,
) -> int:
    """Run the proxy until the client disconnects; 0 on a clean end. PolicyError (the policy
    does not fit the upstream tools) and ProxyStartError propagate."""
    if not command:
        raise ProxyStartError("no upstream server command (put it after `--`)")
    asyncio.run(serve(policy, policy_path, command, log_dir=log_dir, coordinator=coordinator))
    return 0
