"""The shim: one tool call of a session, by its effect class.

The top layer of `atomix.session.TxSession`: a call registers its reads, then runs at once
(no effect), is staged or queued (`defer`: bufferable, irreversible), or, if reversible,
waits until it may run, runs with its before-image taken and its start and result written
to the durable log around it, and is staged for compensation.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import TYPE_CHECKING, Any

from atomix.decisions import AbortPlan
from atomix.effects import REVERSIBLE, Effect, EffectClass
from atomix.errors import IllegalTransition, UnknownTransaction
from atomix.instructions import DriverHooks, Run, Steps
from atomix.scopes import Scope
from atomix.session_wait import WaitingSession
from atomix.tools import KEY_PARAM, Ack, Call, ToolSpec, UnrecordedCall

if TYPE_CHECKING:
    from atomix.log import TxLog


class CallingSession(WaitingSession):
    """A session's tool calls (see the module docstring).

    Guarantees: a reversible call is logged as started (when a log is kept) before it runs,
    and is staged once it has run, even if it raised or its result could not be logged, so
    that an abort compensates it; a duplicated delivery of a staged reversible call does
    not run again; a deferred call never waits, and its effect belongs to the caller's
    current savepoint.
    """

    __slots__ = ()

    # -- the shim -------------------------------------------------------------------------------
    def call_steps(self, spec: ToolSpec, args: dict[str, Any], driver: DriverHooks) -> Steps:
        """One shimmed tool call: register reads, then run, stage or gate by effect class.

        A function with an `idempotency_key` parameter gets the effect's key whenever it runs
        for the effect (applied, released, or executed if reversible). A reversible tool's
        reads are registered in the step that lets it run (see `externalize_steps`).
        """
        reversible = spec.effect is EffectClass.REVERSIBLE
        if spec.reads and not reversible:
            yield from self.read_steps(spec.read_scopes(args), driver)
        if spec.effect is None:
            return (yield Run(lambda: spec.fn(**args)))
        if spec.effect is not EffectClass.REVERSIBLE:
            outcome = self.defer(spec, args)
            if outcome.__class__ is AbortPlan:
                yield from self._abort_and_raise(outcome)
            return outcome
        scopes = tuple(map(self.co.scope, spec.write_scopes(args)))
        key = self.call_key(spec, args)
        return (yield from self._reversible_steps(spec, args, scopes, key, driver))

    def _reversible_steps(
        self,
        spec: ToolSpec,
        args: dict[str, Any],
        scopes: tuple[Scope, ...],
        key: str,
        driver: DriverHooks,
    ) -> Steps:
        """A reversible call with its scopes and key: wait until it may run (reading what it
        reads in the same step), take the before-image, run it, stage it. `call_now` is the
        same sequence for a synchronous driver when nothing waits (`atomix.inline`): change both
        together."""
        reads = spec.read_scopes(args) if spec.reads else ()
        earlier = self._staged(key)
        if earlier is not None:
            # A duplicated delivery must not run again: only one run would be compensated.
            if reads:
                yield from self.read_steps(reads, driver)
            yield from self.stage_steps(earlier)  # the core counts it as a suppressed duplicate
            return earlier.payload.result
        yield from self.externalize_steps(scopes, driver, reads)
        kwargs = {**args, KEY_PARAM: key} if spec.wants_key else args
        call = Call(spec.name, args, key=key)
        before = spec.before
        if before is not None:
            call.before = yield Run(lambda: before(**args))
        compensate = spec.compensate
        assert compensate is not None
        effect = Effect(
            spec.name, REVERSIBLE, scopes, key, compensate=lambda: compensate(call), payload=call
        )
        log = self.co.log
        if log is not None:  # durably BEFORE it runs: a crash mid-call can still be compensated
            yield Run(lambda: log.call_started(self, key, spec, args, call.before), True)
        try:
            call.result = yield Run(lambda: spec.fn(**kwargs))
        except Exception as exc:
            # It may have acted before it raised (half a booking, a request that landed and
            # lost its answer): stage it anyway, so the abort this error leads to compensates
            # it (the compensation sees `call.error`), or reports residue if that fails.
            call.error = exc
            yield from self.stage_steps(effect)
            raise
        if log is not None:
            # It ran: whatever becomes of its log record, it is staged, so an abort
            # compensates it (a record the log cannot take must not lose the effect).
            try:
                recorded = yield from self._log_returned(log, key, call)
                if not recorded:
                    # The log holds a stand-in for its result: the staged effect says so, so
                    # that the intent does not try to describe the result again. The
                    # compensation (a closure over `call`) gets this object, real result and all.
                    call = effect.payload = UnrecordedCall(
                        call.tool, call.args, call.result, call.before, call.error, call.key
                    )
            except GeneratorExit:
                raise
            except BaseException:  # interrupted while the record was written
                yield from self.stage_steps(effect)
                raise
        yield from self.stage_steps(effect)
        return call.result

    def _log_returned(self, log: TxLog, key: str, call: Call) -> Steps:  # -> bool
        """Record a reversible call's result. A result the log cannot describe (its repr
        raises: a detached ORM row) is recorded as a placeholder naming the failure, so the
        call is logged like any other; a log that cannot be written at all leaves the call's
        started record, which recovery compensates, and is warned about."""
        try:
            yield Run(lambda: log.call_returned(self, key, call), True)
            return True
        except Exception as exc:  # noqa: BLE001 - the result, not the log, may be at fault
            stand_in = Call(
                call.tool, call.args, _unrepresentable(call.result, exc), call.before, key=call.key
            )
            try:
                yield Run(lambda: log.call_returned(self, key, stand_in), True)
            except Exception as again:  # noqa: BLE001 - the started record stands
                warnings.warn(
                    f"atomix log: tx{self.txid}: could not record the result of {call.tool!r} "
                    f"({again}); recovery treats the call as started and compensates it",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return False


    def defer(self, spec: ToolSpec, args: dict[str, Any]) -> Ack | AbortPlan:
        """Stage a bufferable call or queue an irreversible one; no waiting is ever needed,
        so drivers call this directly (every deferred call's path) for tools without reads.
        An AbortPlan means the core aborted the transaction: settle it and raise."""
        # self.call_key(spec, args), spelled out: one call per deferred effect
        if spec.key is None:
            key = f"{self.key_prefix}{spec.key_head}#{next(self._ordinal)}:{spec.key_of(args)}"
        else:
            key = f"{self.key_prefix}{spec.key_head}{spec.key_of(args)}"
        kwargs = {**args, KEY_PARAM: key} if spec.wants_key else args
        co = self.co
        template = spec.write_template
        if template is not None:
            text = template.format_map(args)
            scopes: tuple[Scope, ...] = (co._scopes.get(text) or co.scope(text),)
        else:
            scopes = tuple(map(co.scope, spec.write_scopes(args)))
        # Positional: a keyword call is measurably slower on this path. A partial is one
        # object where a closure over fn and kwargs would be four.
        apply = partial(spec.fn, **kwargs)
        effect_class = spec.effect
        assert effect_class is not None  # deferred: bufferable or irreversible
        effect = Effect(spec.name, effect_class, scopes, key, apply, None, None, args)
        lock = co.lock
        lock.acquire()  # (not `with`: see SessionCoordinator.lock)
        try:
            # Inside a savepoint (none: the usual case, without a context lookup) the
            # effect belongs to it, so that its rollback undoes it and nothing else.
            decision = (
                co.core.stage(self.txid, effect)
                if self.savepoints is None
                else co.core.stage(self.txid, effect, self._owner())
            )
        except (IllegalTransition, UnknownTransaction):
            self._raise_if_settled()  # aborted (maybe by resolve) or settled: say so
            raise
        finally:
            lock.release()
        if decision.__class__ is AbortPlan:
            return decision
        return Ack(spec.ack_status, key, spec.name)

    def _staged(self, key: str) -> Effect | None:
        """This transaction's staged effect with this key, if there is one."""
        return self.staged.get(key)


def _unrepresentable(result: object, exc: BaseException) -> str:
    """What a durable log records for a result it cannot describe."""
    return f"<result of type {type(result).__qualname__} not recordable: {type(exc).__name__}: {exc}>"
