"""One transaction's protocol steps, written once for every driver, and the coordinator
that every session of one runtime shares.

A `TxSession` step method (`read_steps`, `commit_steps`, ...) is a generator: it talks to
the core under the coordinator's lock and yields an instruction (see `atomix.instructions`)
whenever something must happen outside the core — block until woken, run a tool function,
carry out a settlement plan. A driver (threads, asyncio, or the harness's virtual clock)
executes the instruction and sends the result back. So the rules live in the core, the
sequencing here, and only the waiting differs between drivers. The runtime's own handles
(`Tx`, `ATx` in `atomix.handles`) are sessions that drive their steps themselves.

The coordinator and the session live together: the coordinator makes sessions (`begin`),
and each session works through its coordinator.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from atomix.decisions import AbortPlan, CommitPlan, Settlement, Wait
from atomix.effects import REVERSIBLE, AbortSource, Effect, EffectClass
from atomix.errors import IllegalTransition, TransactionAborted, UnknownTransaction
from atomix.instructions import ApplyAbort, ApplyCommit, Block, DriverHooks, Run, Signal, Steps
from atomix.manager import RuntimeOptions, TransactionManager
from atomix.scopes import Scope
from atomix.settle import Outcome, report_rollbacks
from atomix.tools import KEY_PARAM, Ack, Call, ToolSpec
from atomix.transaction import ABORTED, OPEN, Transaction

if TYPE_CHECKING:
    from atomix.log import TxLog

# Canonicalising these kinds consults the file system (symlinks, letter case): never memoised.
_FS_KINDS = frozenset({"fs", "sqlite"})
_SCOPE_MEMO_MAX = 1 << 16


class Coordinator:
    """The shared, thread-safe home of one TransactionManager and its wake-ups.

    Every driver of one runtime goes through the same coordinator, so threads and asyncio
    tasks can share transactions' frontiers safely.
    """

    def __init__(
        self,
        options: RuntimeOptions | None = None,
        *,
        apply_attempts: int = 8,
        keep_settlements: bool = True,
        run_id: str | None = None,
    ) -> None:
        self.core = TransactionManager(options)
        # Part of every key: stores keep applied keys across restarts, and transaction
        # numbers restart at 1 in every process, so without it a new process's effects would
        # be dropped as duplicates of an old one's. Random unless the caller (a durable log,
        # or the harness, which wants reproducible keys) names one.
        self.run_id = secrets.token_hex(6) if run_id is None else run_id
        # Every core access holds it. The per-call paths take it with acquire() and release()
        # in try/finally: on CPython 3.11 a `with` block costs as much again (two special
        # method lookups and a three-argument __exit__ call), and a branch takes it thrice.
        self.lock = threading.RLock()
        self.apply_attempts = apply_attempts
        self.keep_settlements = keep_settlements
        self.settlements: list[Settlement] = []
        self._wakers: dict[int, Signal] = {}
        self._scopes: dict[str, Scope] = {}
        # The durable log (driver-side I/O; None: nothing is logged and the steps skip it),
        # and the tools by name, from which recovery redoes a user tool's logged effect
        # (None for a name two different tools share).
        self.log: TxLog | None = None
        self.tools: dict[str, ToolSpec | None] = {}

    def scope(self, spec: str | Scope) -> Scope:
        """The core's canonical scope, memoised for texts whose canonical form depends on the
        text alone (names, URLs); file-system scopes are resolved afresh every time."""
        if spec.__class__ is str:
            found = self._scopes.get(spec)
            if found is not None:
                return found
            scope = self.core.scope(spec)
            if scope.kind not in _FS_KINDS:
                if len(self._scopes) >= _SCOPE_MEMO_MAX:
                    self._scopes.clear()
                self._scopes[spec] = scope
            return scope
        return self.core.scope(spec)

    def begin(
        self, *, group: str | None = None, trace: str | None = None, branch: int = 0
    ) -> TxSession:
        with self.lock:
            tx = self.core.begin(group=group, trace=trace, branch=branch, record=TxSession)
            tx._bind(self)
        return tx

    def adopt(self, settled: list[Settlement], woken: list[int]) -> None:
        """Take note of settlements the core made on its own (losing branches with nothing to
        compensate, settled by resolve); the caller holds the lock."""
        if self.keep_settlements:
            self.settlements.extend(settled)
        if self._wakers:
            self._wake(woken)
            # Also a thread still parked on a settled loser itself: it wakes to find it settled.
            self._wake([s.txid for s in settled])

    def _settled(self, settlement: Settlement, woken: Iterable[int]) -> None:
        # The core has dropped the record (forget=True): its holder keeps it, with the
        # settlement, and the core's map of live transactions does not grow a long-lived heap.
        if self.keep_settlements:
            self.settlements.append(settlement)
        if self._wakers:
            self._wake(woken)
            # Also a thread still parked on this transaction itself (settled by another one,
            # e.g. a losing branch aborted by resolve): it wakes to find it settled.
            self._wake((settlement.txid,))

    def _park(self, txid: int, signal: Signal) -> None:
        self._wakers[txid] = signal

    def _wake(self, txids: Iterable[int]) -> None:
        for txid in txids:
            signal = self._wakers.pop(txid, None)
            if signal is not None:
                signal.set()


class TxSession(Transaction):
    """A driver-agnostic handle on one transaction (see the module docstring). It is the
    core's own record of the transaction (the manager makes it, see `Coordinator.begin`),
    with what the driver side adds: the coordinator and the key prefix. So a handle sees its
    state and settlement without asking the core, and after the core has forgotten it."""

    __slots__ = ("co", "key_prefix", "_ordinal", "_undone")

    co: Coordinator

    def __init__(
        self, txid: int, epoch: int, trace: str, group: str | None = None, branch: int = 0
    ) -> None:
        Transaction.__init__(self, txid, epoch, trace, group, branch)
        # Calls are numbered in the order they reach the shim (next() is atomic, so calls
        # from worker threads get distinct numbers).
        self._ordinal = itertools.count(1)
        # What savepoint rollbacks undid, for the final settlement: (plan, outcome) pairs.
        self._undone: list[tuple[AbortPlan, Outcome]] | None = None

    def _bind(self, co: Coordinator) -> None:
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
            assert isinstance(other, TxSession)  # every record of a coordinator's core is one
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

    def stage_steps(self, effect: Effect) -> Steps:
        with self.co.lock:
            self._raise_if_settled()
            decision = self.co.core.stage(self.txid, effect)
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
            log.intent(self)
        except Exception as exc:  # noqa: BLE001 - e.g. a full disk: fail closed
            with self.co.lock:
                plan = self.co.core.abort(self.txid, AbortSource.PRE_COMMIT_VETO, f"durable log: {exc}")
            yield from self._abort_and_raise(plan)

    def settle_commit_steps(self, plan: CommitPlan) -> Steps:
        log = self.co.log
        if log is None:
            outcome: Outcome = yield ApplyCommit(plan)
        else:  # the committed mark, durably, before the first apply; each step's mark; the end
            hook = log.commit_point(self)
            outcome = yield ApplyCommit(plan, hook)
            if hook is not None:
                log.end(self)
        return self._finish(failed_applies=outcome.failed_applies, errors=outcome.errors)

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
                log.end(self)
        return self._finish(residue=outcome.residue, errors=outcome.errors)

    # -- savepoints -------------------------------------------------------------------------------
    def savepoint(self) -> int:
        """A mark for `rollback_steps`: a nested block begins here."""
        with self.co.lock:
            self._raise_if_settled()
            return self.co.core.savepoint(self.txid)

    def rollback_steps(self, mark: int) -> Steps:
        """Undo what was staged since `mark`: compensate the reversible effects (reverse
        order), drop the rest. The transaction stays open; what was undone, and any residue,
        is reported in its final settlement."""
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

    def _abort_and_raise(self, plan: AbortPlan) -> Steps:
        settlement = yield from self.settle_abort_steps(plan)
        raise TransactionAborted(self.txid, plan.source.value, plan.detail, settlement)

    def _finish(
        self,
        *,
        residue: list[Effect] | None = None,
        failed_applies: list[Effect] | None = None,
        errors: dict[str, BaseException] | None = None,
    ) -> Settlement:
        co = self.co
        lock = co.lock
        lock.acquire()  # (not `with`: see Coordinator.lock)
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
        call = Call(spec.name, args)
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
            log.call_started(self, key, spec, args, call.before)
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
            log.call_returned(self, key, call)
        yield from self.stage_steps(effect)
        return call.result


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
        lock.acquire()  # (not `with`: see Coordinator.lock)
        try:
            decision = co.core.stage(self.txid, effect)
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

