"""Workload tools as every mode sees them: one function that does the real thing, plus the
metadata each settlement mechanism needs (scopes, effect class, before-image, undo, check).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from atomix.effects import EffectClass
from harness.world.substrates import TrialEnv


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one real call reaches a substrate: its idempotency key (None: no dedup) and the
    op-log metadata saying who did it."""

    key: str | None
    meta: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reread:
    """How an agent checks whether a write of its own landed: a read-only call (`tool` with
    `args`) and a test of what that call returns (`landed(result)`: the write's change is
    there). Guarantees nothing about the write itself: it is what an agent reading the object
    back would conclude."""

    tool: str
    args: dict[str, Any]
    landed: Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class ToolDef:
    """A workload tool with its settlement metadata.

    `run` performs the call on the trial's substrates (with the delivery's key); `before`
    captures a before-image and `undo` restores it (compensation, rollback, cancel); `check`
    validates preconditions without any effect (a TCC try). Read-only tools have no effect.
    """

    name: str
    effect: EffectClass | None
    reads: Callable[[TrialEnv, dict[str, Any]], list[str]]
    writes: Callable[[TrialEnv, dict[str, Any]], list[str]]
    run: Callable[[TrialEnv, dict[str, Any], Delivery], Any]
    before: Callable[[TrialEnv, dict[str, Any]], Any] | None = None
    undo: Callable[[TrialEnv, dict[str, Any], Any, Delivery], None] | None = None
    check: Callable[[TrialEnv, dict[str, Any]], None] | None = None
    idempotent: bool = False  # applying it twice leaves the same state (a blind overwrite)
    key: Callable[[dict[str, Any]], str] | None = None  # the tool's part of an idempotency key
    # Plausible other arguments an agent might try after a failure (a wrong variant, another
    # payment method); None: nothing plausible to change.
    alternatives: Callable[[TrialEnv, dict[str, Any], Any], dict[str, Any] | None] | None = None
    # How to read back the object a write changes, to tell whether it landed (after a refusal
    # saying the object is no longer in the state the write needs); None: no way to check.
    reread: Callable[[dict[str, Any]], Reread | None] | None = None

    def __post_init__(self) -> None:
        if self.effect is not None and self.effect is not EffectClass.IRREVERSIBLE:
            if self.before is None or self.undo is None:
                raise ValueError(f"tool {self.name!r}: a revocable effect needs before and undo")


@dataclass(slots=True)
class ToolCall:
    """One logical call of a tool by an agent. `op_id` names it across retries and modes, so
    a duplicate application of the same call can be recognised in the op log."""

    tool: ToolDef
    args: dict[str, Any]
    op_id: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.tool.name


class ToolError(Exception):
    """A tool refused the call (its own precondition error, not an injected fault)."""
