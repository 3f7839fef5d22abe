"""A session's record, keys and savepoint tree, and the steps that settle it.

The bottom layer of `atomix.session.TxSession` (see `atomix.session` for the whole): how a
decided commit or abort is carried out (an instruction for the driver, with the durable
log's marks around it: the committed mark retried with a short back-off and, if it cannot
be written, the commit revoked) and finished in the core; and savepoint rollbacks, whose
outcomes the final settlement reports. Nothing here waits for another transaction.
"""

from __future__ import annotations

import contextvars
import itertools
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from atomix.decisions import AbortPlan, CommitPlan, Settlement
from atomix.effects import AbortSource, Effect
from atomix.errors import IllegalTransition, TransactionAborted
from atomix.instructions import ApplyAbort, ApplyCommit, Run, Steps
from atomix.session_coordinator import SessionCoordinator
from atomix.settle import Outcome, report_rollbacks
from atomix.tools import ToolSpec
from atomix.transaction import ABORTED, Transaction

if TYPE_CHECKING:
    from atomix.log import TxLog

# Pauses (seconds) before each attempt at a committed mark: a full disk or a transient I/O
# error gets a few chances, well under a second in all, before the commit is refused.
_MARK_BACKOFF = (0.0, 0.01, 0.05, 0.2)


#: The savepoint the calling task or thread is in: (its transaction's session, savepoint id),
#: set by a savepoint's block. Each asyncio task and each worker started in a copy of the
#: context sees its own, so blocks that run at the same time stage into their own savepoints.
current_savepoint: contextvars.ContextVar[tuple[SettlingSession, int] | None] = contextvars.ContextVar(
    "atomix_current_savepoint", default=None
)


class SettlingSession(Transaction):
    """The bottom layer of a session (`atomix.session.TxSession`): the core's own record of
    one transaction with what the driver side adds (the coordinator, the key prefix, the
    call ordinal), its savepoint tree, and its settlement.

    Guarantees: every effect key starts with the session's run:trace:epoch:branch: prefix;
    a decided commit is applied only after its committed mark is durable (when a log is
    kept), and if no attempt at the mark succeeds the commit is revoked before anything is
    applied or released, and the transaction aborts instead; a decided abort compensates
    (each compensation marked in the log) and ends; a savepoint rollback undoes what that
    savepoint and those nested in it staged, nothing else, and what it undid (and any
    residue) is reported in the final settlement; `_finish` settles exactly once, through
    the core, and wakes the transaction's waiters."""

    __slots__ = ("co", "key_prefix", "_ordinal", "_undone")

    co: SessionCoordinator

    def __init__(
        self, txid: int, epoch: int, trace: str, group: str | None = None, branch: int = 0
    ) -> None:
        Transaction.__init__(self, txid, epoch, trace, group, branch)
        # Calls are numbered in the order they reach the shim (next() is atomic, so calls
        # from worker threads get distinct numbers).
        self._ordinal = itertools.count(1)
        # What savepoint rollbacks undid, for the final settlement: (plan, outcome) pairs.
        self._undone: list[tuple[AbortPlan, Outcome]] | None = None

    def _bind(self, co: SessionCoordinator) -> None:
        """Attach the coordinator (every session is bound once, as it is begun) and make the
        key prefix every effect's key starts with: run:trace:epoch:branch: (paper Table 4,
        with the coordinator's run identity in front when it has one)."""
        self.co = co
        run = co.run_id
        self.key_prefix = (
            f"{run}:{self.trace}:{self.epoch}:{self.branch}:"
            if run
            else f"{self.trace}:{self.epoch}:{self.branch}:"
        )

    def key(self, tool: str, part: str) -> str:
        """The idempotency key of one effect: run:trace:epoch:branch:tool:part (paper Table 4,
        with the run identity in front)."""
        return f"{self.key_prefix}{tool}:{part}"

    def delivery_key(self, key: str) -> str | None:
        """The key a shim hands a substrate with a delivery of the effect keyed `key`: the key
        itself, or None when the runtime delivers without keys (`keyed_delivery=False`, an
        ablation: a re-delivery then looks like a new effect to the substrate). The runtime
        keeps `key` for its own records either way."""
        return key if self.co.core.options.keyed_delivery else None

    def call_key(self, spec: ToolSpec, args: dict[str, Any]) -> str:
        """The key of one shimmed call. An explicit key template or function is the call's
        identity on its own (the same arguments twice are one effect); otherwise the call's
        ordinal in this transaction comes first, so two identical calls are two effects. A
        retry of one call (an apply retried at commit) reuses the key it was given."""
        if spec.key is not None:
            return f"{self.key_prefix}{spec.key_head}{spec.key_of(args)}"
        return f"{self.key_prefix}{spec.key_head}#{next(self._ordinal)}:{spec.key_of(args)}"

    def _raise_if_settled(self) -> None:
        """Raise TransactionAborted once the transaction is aborted (here or by another
        party, e.g. resolve); IllegalTransition for any step after it committed."""
        done = self.settlement
        if done is not None:
            if done.committed:
                raise IllegalTransition(self.txid, "committed", "a step after settlement")
            raise TransactionAborted(self.txid, done.abort_source or "aborted", done.detail, done)
        if self.state is ABORTED:
            raise TransactionAborted(self.txid, self.abort_source or "aborted", self.abort_detail)

    # -- savepoints -------------------------------------------------------------------------------
    def savepoint(self) -> int:
        """Open a savepoint for `rollback_steps`, nested in the caller's current one (see
        `current_savepoint`); the caller makes it current for its block (`enter_savepoint`)."""
        with self.co.lock:
            self._raise_if_settled()
            return self.co.core.savepoint(self.txid, self._owner())

    def _owner(self) -> int:
        """The savepoint of this transaction the calling task or thread is in (0: none)."""
        current = current_savepoint.get()
        return current[1] if current is not None and current[0] is self else 0

    def release_savepoint(self, savepoint: int) -> None:
        with self.co.lock:
            if not self.finished:
                self.co.core.release(self.txid, savepoint)

    def rollback_steps(self, mark: int) -> Steps:
        """Undo what savepoint `mark` and those nested in it staged: compensate the
        reversible effects (reverse order), drop the rest; what other savepoints (sibling
        blocks running at the same time) and the transaction itself staged stays. The
        transaction stays open; what was undone, and any residue, is reported in its final
        settlement."""
        with self.co.lock:
            self._raise_if_settled()
            plan = self.co.core.rollback_to(self.txid, mark)
        if not plan.compensate and not plan.drop:
            return
        log = self.co.log
        # Logged compensations are marked, so recovery does not compensate them again.
        outcome: Outcome = yield ApplyAbort(plan, None if log is None else log.abort_hook(self))
        with self.co.lock:
            if self._undone is None:
                self._undone = []
            self._undone.append((plan, outcome))

    # -- settling -------------------------------------------------------------------------------
    def abort_steps(self, source: AbortSource | str = AbortSource.PRE_COMMIT_VETO, detail: str = "") -> Steps:
        with self.co.lock:
            if self.settlement is not None:
                return self.settlement
            plan = self.co.core.abort(self.txid, source, detail)
        return (yield from self.settle_abort_steps(plan))

    def settle_abort_steps(self, plan: AbortPlan) -> Steps:
        log = self.co.log
        if log is None:
            outcome: Outcome = yield ApplyAbort(plan)
        else:  # each compensation's mark, then the end (a transaction never logged: neither)
            hook = log.abort_hook(self)
            outcome = yield ApplyAbort(plan, hook)
            if hook is not None:
                yield Run(lambda: log.end(self), True)
        return self._finish(residue=outcome.residue, errors=outcome.errors)

    def _abort_and_raise(self, plan: AbortPlan) -> Steps:
        settlement = yield from self.settle_abort_steps(plan)
        raise TransactionAborted(self.txid, plan.source.value, plan.detail, settlement)

    def settle_commit_steps(self, plan: CommitPlan) -> Steps:
        log = self.co.log
        if log is None:
            outcome: Outcome = yield ApplyCommit(plan)
        else:  # the committed mark, durably, before the first apply; each step's mark; the end
            hook = yield from self._mark_committed(log)
            outcome = yield ApplyCommit(plan, hook)
            if hook is not None:  # (a delivery that failed stays in the log, to be retried)
                yield Run(lambda: log.end(self, outcome.errors), True)
        return self._finish(failed_applies=outcome.failed_applies, errors=outcome.errors)

    def _mark_committed(self, log: TxLog) -> Steps:
        """Write the committed mark durably, retried with a short back-off; the per-step hook
        (None: nothing of it is logged). A commit the log cannot record must not happen: the
        next start's recovery would abort what the application saw commit. So when every
        attempt fails, the core's commit decision is revoked before anything was applied or
        released, the transaction aborts (its reversible effects compensated, the rest
        dropped), and TransactionAborted says why."""
        error: Exception | None = None
        for attempt, pause in enumerate(_MARK_BACKOFF):
            if attempt:
                yield Run(partial(time.sleep, pause), True)
            try:
                logged = yield Run(lambda: log.committed(self), True)
            except Exception as exc:  # noqa: BLE001 - e.g. a full disk: tried again, then refused
                error = exc
                continue
            return log.step_hook(self) if logged else None
        detail = (
            f"durable log: the committed mark could not be written after {len(_MARK_BACKOFF)} "
            f"attempts ({type(error).__name__}: {error}); nothing was applied or released"
        )
        with self.co.lock:
            abort = self.co.core.revoke_commit(self.txid, AbortSource.PRE_COMMIT_VETO, detail)
        yield from self._abort_and_raise(abort)

    def _finish(
        self,
        *,
        residue: list[Effect] | None = None,
        failed_applies: list[Effect] | None = None,
        errors: dict[str, BaseException] | None = None,
    ) -> Settlement:
        co = self.co
        lock = co.lock
        lock.acquire()  # (not `with`: see SessionCoordinator.lock)
        try:
            undone = self._undone
            if undone:  # residue left by savepoint rollbacks changed the world for good too
                residue = [*(residue or ()), *(e for _, out in undone for e in out.residue)]
            settlement, woken = co.core.finish(
                self.txid,
                residue=residue or (),
                failed_applies=failed_applies or (),
                forget=True,
            )
            if errors:
                settlement.errors = errors
            if undone:
                report_rollbacks(settlement, undone, co.core.options.classify_residue)
            co._settled(settlement, woken)
        finally:
            lock.release()
        return settlement
