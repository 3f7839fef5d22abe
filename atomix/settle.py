"""Carrying out settlement plans: the one place drivers apply, release and compensate.

Applies are retried under the same idempotency key, so a call that failed ambiguously
(applied, then lost its answer) is not applied twice by a substrate that honours keys.
A compensation is tried once: if it fails, the effect is residue and is reported as such.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from atomix.decisions import AbortPlan, CommitPlan, Settlement
from atomix.effects import BatchApplier, Effect


@dataclass(slots=True, init=False)
class Outcome:
    """What happened while carrying out a plan."""

    failed_applies: list[Effect]
    residue: list[Effect]
    # Effect key -> the exception that made it a failed apply or residue (the last attempt's).
    errors: dict[str, BaseException]

    # Written out: one is made per settled transaction, and the generated __init__ calls a
    # factory per field.
    def __init__(
        self,
        failed_applies: list[Effect] | None = None,
        residue: list[Effect] | None = None,
        errors: dict[str, BaseException] | None = None,
    ) -> None:
        self.failed_applies = [] if failed_applies is None else failed_applies
        self.residue = [] if residue is None else residue
        self.errors = {} if errors is None else errors

    def failed(self, effects: Sequence[Effect], exc: BaseException) -> None:
        self.failed_applies.extend(effects)
        for effect in effects:
            self.errors[effect.key] = exc

    def left(self, effect: Effect, exc: BaseException) -> None:
        self.residue.append(effect)
        self.errors[effect.key] = exc


def _batches(effects: Sequence[Effect]) -> list[tuple[BatchApplier | None, list[Effect]]]:
    """Group effects by batch applier in order of first appearance; singles stay alone."""
    groups: dict[int, tuple[BatchApplier, list[Effect]]] = {}
    out: list[tuple[BatchApplier | None, list[Effect]]] = []
    for effect in effects:
        if effect.batch is None:
            out.append((None, [effect]))
            continue
        slot = groups.get(id(effect.batch))
        if slot is None:
            slot = (effect.batch, [])
            groups[id(effect.batch)] = slot
            out.append(slot)
        slot[1].append(effect)
    return out


def _steps(plan: CommitPlan) -> list[tuple[Callable[[], Any], list[Effect]]]:
    steps: list[tuple[Callable[[], Any], list[Effect]]] = []
    apply = plan.apply
    if len(apply) == 1 and apply[0].batch is None:  # the usual small case, without grouping
        batches: list[tuple[BatchApplier | None, list[Effect]]] = [(None, [apply[0]])]
    else:
        batches = _batches(apply)
    for batch, effects in batches:
        if batch is not None:
            steps.append((partial(batch.apply_batch, effects), effects))
        elif effects[0].apply is not None:
            steps.append((effects[0].apply, effects))
    for effect in plan.release:
        if effect.apply is not None:
            steps.append((effect.apply, [effect]))
    return steps


#: Called after each commit step with its effects and whether they landed (a durable log
#: marks them settled, so recovery does not deliver them again).
StepHook = Callable[[Sequence[Effect], bool], None]
#: Called after each compensation with the effect and whether it succeeded.
CompensationHook = Callable[[Effect, bool], None]


def carry_out_commit(
    plan: CommitPlan, *, attempts: int = 3, on_step: StepHook | None = None
) -> Outcome:
    outcome = Outcome()
    apply = plan.apply
    if on_step is None and not plan.release and len(apply) == 1 and apply[0].batch is None:
        # The usual small commit, one buffered effect: the loop below, without building steps.
        effect = apply[0]
        if effect.apply is not None:
            for attempt in range(attempts):
                try:
                    effect.apply()
                    break
                except Exception as exc:  # noqa: BLE001 - retried under its key, as below
                    if attempt == attempts - 1:
                        outcome.failed([effect], exc)
        return outcome
    for step, effects in _steps(plan):
        ok = False
        for attempt in range(attempts):
            try:
                step()
                ok = True
                break
            except Exception as exc:  # noqa: BLE001 - any tool error is retried under its key
                if attempt == attempts - 1:
                    outcome.failed(effects, exc)
        if on_step is not None:
            on_step(effects, ok)
    return outcome


def carry_out_abort(plan: AbortPlan, *, on_compensated: CompensationHook | None = None) -> Outcome:
    outcome = Outcome()
    for effect in plan.compensate:
        ok = False
        try:
            assert effect.compensate is not None
            effect.compensate()
            ok = True
        except Exception as exc:  # noqa: BLE001 - a failed compensation is residue
            outcome.left(effect, exc)
        if on_compensated is not None:
            on_compensated(effect, ok)
    return outcome


async def _maybe_await(fn: Callable[[], Any]) -> Any:
    result = fn()
    if inspect.isawaitable(result):
        result = await result
    return result


async def acarry_out_commit(
    plan: CommitPlan, *, attempts: int = 3, on_step: StepHook | None = None
) -> Outcome:
    outcome = Outcome()
    for step, effects in _steps(plan):
        ok = False
        for attempt in range(attempts):
            try:
                await _maybe_await(step)
                ok = True
                break
            except Exception as exc:  # noqa: BLE001
                if attempt == attempts - 1:
                    outcome.failed(effects, exc)
        if on_step is not None:  # a durable log's mark: off the event loop (it may fsync)
            await asyncio.to_thread(on_step, effects, ok)
    return outcome


async def acarry_out_abort(
    plan: AbortPlan, *, on_compensated: CompensationHook | None = None
) -> Outcome:
    outcome = Outcome()
    for effect in plan.compensate:
        ok = False
        try:
            assert effect.compensate is not None
            comp: Callable[[], Awaitable[Any] | Any] = effect.compensate
            await _maybe_await(comp)
            ok = True
        except Exception as exc:  # noqa: BLE001
            outcome.left(effect, exc)
        if on_compensated is not None:  # as in acarry_out_commit: off the event loop
            await asyncio.to_thread(on_compensated, effect, ok)
    return outcome


def report_rollbacks(
    settlement: Settlement, undone: list[tuple[AbortPlan, Outcome]], classify: bool
) -> None:
    """Add to a transaction's final settlement what its savepoint rollbacks compensated,
    dropped or left as residue (`classify`: report residue, as the runtime's options say)."""
    compensated: list[str] = []
    dropped: list[str] = []
    residue: list[str] = []
    for plan, outcome in undone:
        left = {e.key for e in outcome.residue}
        compensated += [e.key for e in plan.compensate if e.key not in left]
        dropped += [e.key for e in plan.drop]
        residue += [e.key for e in plan.compensate if e.key in left]
        if outcome.errors:
            settlement.errors = {**outcome.errors, **settlement.errors}
    settlement.compensated = (*compensated, *settlement.compensated)
    settlement.dropped = (*dropped, *settlement.dropped)
    if classify and residue:
        settlement.residue = (*residue, *settlement.residue)
