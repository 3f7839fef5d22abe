"""The steps of a session that may wait for other transactions.

The middle layer of `atomix.session.TxSession`: the wait loop (`_decide`: ask the core
until it stops saying Wait, with deadlines, expiry of blockers whose drivers are gone, and
cancellation) and the steps that go through it: read, externalize, reserve and commit
(whose intent is written to the durable log before the core is asked), plus stage and seal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from atomix.decisions import AbortPlan, Wait
from atomix.effects import AbortSource, Effect
from atomix.instructions import Block, DriverHooks, Run, Signal, Steps
from atomix.scopes import Scope
from atomix.session_settle import SettlingSession
from atomix.transaction import ABORTED, OPEN

if TYPE_CHECKING:
    from atomix.log import TxLog


class WaitingSession(SettlingSession):
    """A session's waiting steps (see the module docstring).

    Guarantees: a step returns only once the core has stopped saying Wait; a wait longer
    than the driver's timeout aborts the transaction (source `timeout`) unless a blocker
    past its own deadline is aborted instead; a waiter the driver interrupts aborts (source
    `cancelled`), settles, and re-raises what was thrown in; a commit whose intent cannot be
    logged aborts before the core decides it.
    """

    __slots__ = ()

    # -- waiting --------------------------------------------------------------------------------
    def _decide(
        self,
        attempt: Callable[[], Any],
        new_signal: Callable[[], Signal],
        clock: Callable[[], float],
        timeout: float | None,
    ) -> Steps:
        """Ask the core until it stops saying Wait; time out into an abort.

        The deadline (first wait + `timeout`, in the driver's clock) is recorded in the core,
        so that if this driver goes away, a waiter behind this transaction (which wakes at
        its blockers' deadlines too) expires it there and carries out its abort. A waiter
        the driver interrupts (it throws any exception in at the Block: CancelledError,
        KeyboardInterrupt, ...) aborts with source `cancelled`, settles, and re-raises it.
        """
        co = self.co
        start: float | None = None
        deadline: float | None = None
        while True:
            with co.lock:
                self._raise_if_settled()
                decision = attempt()
                if isinstance(decision, Wait):
                    # Made only when needed (an Event is not free). A driver that cannot wait
                    # raises here, before anything about this wait is recorded.
                    signal = new_signal()
                    now = clock()
                    if start is None:
                        start = now
                        if timeout is not None:
                            deadline = now + timeout
                            co.core.wait_until(self.txid, deadline)
                    expired = co.core.expire(now, but=self.txid)
                    if not expired:
                        co._park(self.txid, signal)  # parked under the lock
                        wake = co.core.next_deadline([b.txid for b in decision.blockers], now)
                elif start is not None:
                    co.core.done_waiting(self.txid)
            if not isinstance(decision, Wait):
                if start is not None:
                    self.waited += clock() - start
                return decision
            assert start is not None  # set at the first Wait
            if expired:  # blockers whose drivers are gone: abort them here, then ask again
                yield from self._settle_expired(expired, start, clock)
                continue
            if wake is None or (deadline is not None and deadline <= wake):
                own = True  # (computed as before deadlines were the core's: same float rounding)
                remaining = None if timeout is None else timeout - (now - start)
            else:
                own = False
                remaining = wake - now
            woken = remaining is None or remaining > 0
            if woken:
                try:
                    woken = yield Block(signal, remaining)
                except GeneratorExit:  # the steps are closed (abandoned): nothing to settle
                    raise
                except BaseException as exc:
                    yield from self._interrupted(exc, start, clock)
                    raise
            if not woken and own:
                with co.lock:
                    co._wakers.pop(self.txid, None)
                    self._raise_if_settled()
                    # A blocker past its own deadline is the one to abort, not this one.
                    expired = co.core.expire(clock(), but=self.txid)
                    if not expired:
                        co.core.done_waiting(self.txid)
                        self.waited += clock() - start
                        blockers = ", ".join(f"tx{b.txid}@{b.epoch}" for b in decision.blockers)
                        return co.core.abort(
                            self.txid, AbortSource.TIMEOUT, f"still waiting on {blockers}"
                        )
                yield from self._settle_expired(expired, start, clock)

    def _settle_expired(
        self, plans: list[AbortPlan], start: float, clock: Callable[[], float]
    ) -> Steps:
        """Carry out the aborts of other transactions that the core expired for us, and finish
        them (their scopes are released, their waiters and their handles woken)."""
        for plan in plans:
            with self.co.lock:
                other = self.co.core.get(plan.txid)
            assert isinstance(other, SettlingSession)  # every record of a coordinator's core is one
            try:
                yield from other.settle_abort_steps(plan)
            except GeneratorExit:
                raise
            except BaseException as exc:
                if not other.finished:  # what ran is unknown: report it all as residue
                    other._finish(residue=list(plan.compensate))
                yield from self._interrupted(exc, start, clock)
                raise

    def _interrupted(self, exc: BaseException, start: float, clock: Callable[[], float]) -> Steps:
        """The driver threw `exc` in while this transaction waited: abort it (source
        `cancelled`) and carry out the plan, unless another party aborted it already."""
        co = self.co
        with co.lock:
            co._wakers.pop(self.txid, None)
            co.core.done_waiting(self.txid)
            if self.settlement is not None or self.state is ABORTED:
                return
            self.waited += clock() - start
            plan = co.core.abort(
                self.txid, AbortSource.CANCELLED, f"{type(exc).__name__} while waiting"
            )
        try:
            yield from self.settle_abort_steps(plan)
        except GeneratorExit:
            raise
        except BaseException:
            # Interrupted again while compensating: what ran is unknown, so it is all
            # residue, and the scopes are released all the same.
            if not self.finished:
                self._finish(residue=list(plan.compensate))
            raise

    # -- steps ----------------------------------------------------------------------------------
    def read_steps(self, scopes: Iterable[str | Scope], driver: DriverHooks) -> Steps:
        scopes = [self.co.scope(s) for s in scopes]
        decision = yield from self._decide(
            lambda: self.co.core.read(self.txid, scopes), driver.new_signal, driver.now, driver.timeout
        )
        if isinstance(decision, AbortPlan):
            yield from self._abort_and_raise(decision)

    def externalize_steps(
        self,
        scopes: Iterable[str | Scope],
        driver: DriverHooks,
        reads: Iterable[str | Scope] = (),
    ) -> Steps:
        """Wait until a reversible effect on `scopes` may run; `reads` (what the call
        observes first) are read in the same step (see `TransactionManager.externalize`)."""
        scopes = [self.co.scope(s) for s in scopes]
        observed = [self.co.scope(s) for s in reads]
        decision = yield from self._decide(
            lambda: self.co.core.externalize(self.txid, scopes, observed),
            driver.new_signal,
            driver.now,
            driver.timeout,
        )
        if isinstance(decision, AbortPlan):
            yield from self._abort_and_raise(decision)

    def reserve_steps(self, scopes: Iterable[str | Scope], driver: DriverHooks) -> Steps:
        """Claim `scopes` before the body touches them (see `TransactionManager.reserve`),
        waiting until every earlier holder of one has settled."""
        resolved = [self.co.scope(s) for s in scopes]
        decision = yield from self._decide(
            lambda: self.co.core.reserve(self.txid, resolved), driver.new_signal, driver.now, driver.timeout
        )
        if isinstance(decision, AbortPlan):
            yield from self._abort_and_raise(decision)

    def stage_steps(self, effect: Effect) -> Steps:
        with self.co.lock:
            self._raise_if_settled()
            decision = self.co.core.stage(self.txid, effect, self._owner())
        if isinstance(decision, AbortPlan):
            yield from self._abort_and_raise(decision)

    def seal(self) -> None:
        with self.co.lock:
            self.co.core.seal(self.txid)

    def commit_steps(self, driver: DriverHooks) -> Steps:
        """Seal (if open), wait for the frontiers, then settle. Returns the Settlement or
        raises TransactionAborted carrying it."""
        with self.co.lock:
            self._raise_if_settled()
            if self.state is OPEN:
                self.co.core.seal(self.txid)
        log = self.co.log
        if log is not None:
            yield from self._log_intent(log)
        decision = yield from self._decide(
            lambda: self.co.core.try_commit(self.txid), driver.new_signal, driver.now, driver.timeout
        )
        if isinstance(decision, AbortPlan):
            yield from self._abort_and_raise(decision)
        return (yield from self.settle_commit_steps(decision))

    def _log_intent(self, log: TxLog) -> Steps:
        """Write the intent (the staged effects' redo records) before commit starts; a
        transaction whose intent could not be logged must not commit, so it aborts."""
        try:
            yield Run(lambda: log.intent(self), True)
        except Exception as exc:  # noqa: BLE001 - e.g. a full disk: fail closed
            with self.co.lock:
                plan = self.co.core.abort(self.txid, AbortSource.PRE_COMMIT_VETO, f"durable log: {exc}")
            yield from self._abort_and_raise(plan)
