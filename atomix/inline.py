"""A session's inline paths: its commit and reversible call without generators.

They are the same sequences as `TxSession.commit_steps` and `TxSession._reversible_steps`,
for a synchronous driver that would carry out every instruction where it stands: when nothing
must wait and no durable log is kept, they run as a few plain calls. Anything else falls back
to the steps, which decide again. Change a sequence here and there together.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from atomix.decisions import PROCEED, AbortPlan, CommitPlan, Settlement
from atomix.effects import REVERSIBLE, Effect
from atomix.errors import TransactionAborted
from atomix.scopes import Scope
from atomix.session import TxSession
from atomix.settle import carry_out_abort, carry_out_commit
from atomix.thread_driver import SyncDriver
from atomix.tools import KEY_PARAM, Call, ToolSpec
from atomix.transaction import ABORTED, OPEN


class InlineSession(TxSession):
    """A session with inline paths for a synchronous driver (see the module docstring).

    Guarantees: an inline path changes the core exactly as its steps would (the same core
    calls, in the same order, under the same lock); where the steps would wait or write a
    durable log, it hands over to them, and they decide again.
    """

    __slots__ = ()

    def commit_now(self, attempts: int) -> Settlement | None:
        """Seal, decide and, if the core commits at once, apply and finish here; raise
        TransactionAborted (settled) if it aborts. None: drive `commit_steps` instead (a
        durable log to write first, or a Wait: the steps decide again and wait)."""
        co = self.co
        if co.log is not None:
            return None
        lock = co.lock
        lock.acquire()  # (not `with`: see Coordinator.lock)
        try:
            self._raise_if_settled()
            core = co.core
            if self.state is OPEN:
                core.seal(self.txid)
            decision = core.try_commit(self.txid)
        finally:
            lock.release()
        if decision.__class__ is CommitPlan:
            return self.settle_commit_now(decision, attempts)
        if decision.__class__ is AbortPlan:
            self._abort_now(decision)
        return None

    def settle_commit_now(self, plan: CommitPlan, attempts: int) -> Settlement | None:
        """`settle_commit_steps` carried out here; None when a durable log is kept (drive
        the steps then: they write its marks)."""
        if self.co.log is not None:
            return None
        outcome = carry_out_commit(plan, attempts=attempts)
        if not outcome.failed_applies:
            return self._finish()
        return self._finish(failed_applies=outcome.failed_applies, errors=outcome.errors)

    def _abort_now(self, plan: AbortPlan) -> None:
        """`_abort_and_raise` without a log (the caller checked): compensate, finish, raise."""
        outcome = carry_out_abort(plan)
        settlement = self._finish(residue=outcome.residue, errors=outcome.errors)
        raise TransactionAborted(self.txid, plan.source.value, plan.detail, settlement)

    def call_now(self, spec: ToolSpec, args: dict[str, Any], driver: SyncDriver) -> Any:
        """A reversible call for a synchronous driver (`driver.drive` runs steps): inline
        when the core lets it run at once and no log is kept, else through the steps."""
        co = self.co
        if co.log is not None:
            return driver.drive(self.call_steps(spec, args, driver))
        template = spec.write_template
        if template is not None:
            text = template.format_map(args)
            scopes: tuple[Scope, ...] = (co._scopes.get(text) or co.scope(text),)
        else:
            scopes = tuple(map(co.scope, spec.write_scopes(args)))
        # self.call_key(spec, args), spelled out as in `defer`
        if spec.key is None:
            key = f"{self.key_prefix}{spec.key_head}#{next(self._ordinal)}:{spec.key_of(args)}"
        else:
            key = f"{self.key_prefix}{spec.key_head}{spec.key_of(args)}"
        if spec.reads or key in self.staged:  # reads to resolve, or a duplicated delivery
            return driver.drive(self._reversible_steps(spec, args, scopes, key, driver))
        lock = co.lock
        core = co.core
        txid = self.txid
        lock.acquire()
        try:
            if self.settlement is not None or self.state is ABORTED:
                self._raise_if_settled()
            decision = core.externalize(txid, scopes)
        finally:
            lock.release()
        if decision is not PROCEED:
            if decision.__class__ is AbortPlan:
                self._abort_now(decision)
            # Wait: the steps decide again (the core parked it meanwhile) and wait.
            return driver.drive(self._reversible_steps(spec, args, scopes, key, driver))
        call = Call(spec.name, args, key=key)
        if spec.before is not None:
            call.before = spec.before(**args)
        compensate = spec.compensate
        assert compensate is not None  # reversible: define_tool requires one
        effect = Effect(spec.name, REVERSIBLE, scopes, key, None, partial(compensate, call), None, call)
        try:
            call.result = spec.fn(**{**args, KEY_PARAM: key} if spec.wants_key else args)
        except Exception as exc:
            call.error = exc  # staged all the same: see _reversible_steps
            self._stage_now(effect)
            raise
        lock.acquire()
        try:
            if self.settlement is not None or self.state is ABORTED:
                self._raise_if_settled()
            decision = (
                core.stage(txid, effect)
                if self.savepoints is None
                else core.stage(txid, effect, self._owner())
            )
        finally:
            lock.release()
        if decision.__class__ is AbortPlan:
            self._abort_now(decision)
        return call.result

    def _stage_now(self, effect: Effect) -> None:
        co = self.co
        lock = co.lock
        lock.acquire()
        try:
            self._raise_if_settled()
            decision = co.core.stage(self.txid, effect, self._owner())
        finally:
            lock.release()
        if decision.__class__ is AbortPlan:
            self._abort_now(decision)
