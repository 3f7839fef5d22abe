"""Carrying out settlement plans: the one place drivers apply, release and compensate.

Applies are retried under the same idempotency key, so a call that failed ambiguously
(applied, then lost its answer) is not applied twice by a substrate that honours keys.
A compensation is tried once: if it fails, the effect is residue and is reported as such.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atomix.decisions import AbortPlan, CommitPlan
from atomix.effects import Effect


@dataclass(slots=True)
class Outcome:
    """What happened while carrying out a plan."""

    failed_applies: list[Effect] = field(default_factory=list)
    residue: list[Effect] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)


def _batches(effects: Sequence[Effect]) -> list[tuple[Any, list[Effect]]]:
    """Group effects by batch applier in order of first appearance; singles stay alone."""
    groups: dict[int, tuple[Any, list[Effect]]] = {}
    out: list[tuple[Any, list[Effect]]] = []
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
        batches: list[tuple[Any, list[Effect]]] = [(None, [apply[0]])]
    else:
        batches = _batches(apply)
    for batch, effects in batches:
        if batch is not None:
            steps.append((lambda b=batch, es=effects: b.apply_batch(es), effects))
        elif effects[0].apply is not None:
            steps.append((effects[0].apply, effects))
    for effect in plan.release:
        if effect.apply is not None:
            steps.append((effect.apply, [effect]))
    return steps


def carry_out_commit(plan: CommitPlan, *, attempts: int = 3) -> Outcome:
    outcome = Outcome()
    for step, effects in _steps(plan):
        for attempt in range(attempts):
            try:
                step()
                break
            except Exception as exc:  # noqa: BLE001 - any tool error is retried under its key
                if attempt == attempts - 1:
                    outcome.failed_applies.extend(effects)
                    outcome.errors.append(exc)
    return outcome


def carry_out_abort(plan: AbortPlan) -> Outcome:
    outcome = Outcome()
    for effect in plan.compensate:
        try:
            assert effect.compensate is not None
            effect.compensate()
        except Exception as exc:  # noqa: BLE001 - a failed compensation is residue
            outcome.residue.append(effect)
            outcome.errors.append(exc)
    return outcome


async def _maybe_await(fn: Callable[[], Any]) -> Any:
    result = fn()
    if inspect.isawaitable(result):
        result = await result
    return result


async def acarry_out_commit(plan: CommitPlan, *, attempts: int = 3) -> Outcome:
    outcome = Outcome()
    for step, effects in _steps(plan):
        for attempt in range(attempts):
            try:
                await _maybe_await(step)
                break
            except Exception as exc:  # noqa: BLE001
                if attempt == attempts - 1:
                    outcome.failed_applies.extend(effects)
                    outcome.errors.append(exc)
    return outcome


async def acarry_out_abort(plan: AbortPlan) -> Outcome:
    outcome = Outcome()
    for effect in plan.compensate:
        try:
            assert effect.compensate is not None
            comp: Callable[[], Awaitable[Any] | Any] = effect.compensate
            await _maybe_await(comp)
        except Exception as exc:  # noqa: BLE001
            outcome.residue.append(effect)
            outcome.errors.append(exc)
    return outcome
