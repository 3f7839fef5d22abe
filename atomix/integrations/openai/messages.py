"""The tool messages the model reads: each result as it is if it stands, else why it does
not, so that the model never builds on a call that no longer exists."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from atomix.decisions import Settlement
from atomix.errors import CommitIncomplete
from atomix.integrations.openai.turn import Failed, Turn
from atomix.integrations.openai.wire import ToolCall
from atomix.tools import Ack

_UNDO = "staged writes dropped, queued actions never sent, reversible actions compensated"


def messages(
    calls: list[ToolCall],
    turn: Turn,
    *,
    boundary: str,
    on_error: str,
    settled: Settlement | None,
    committed: bool,
    incomplete: CommitIncomplete | None = None,
) -> list[dict[str, Any]]:
    """One `{"role": "tool", "tool_call_id", "content"}` message per call, in order.

    `settled` is the settlement of the turn's own transaction (boundary "turn"), whose
    residue the messages warn about; `committed` says whether deferred calls have now taken
    effect; `incomplete` names the effects that did not land at that commit."""
    undone = _undone(calls, turn, boundary, on_error)
    if undone is not None and boundary == "turn":
        if settled is not None and settled.residue:
            cause, consequence = undone
            consequence += (
                f". Warning: {len(settled.residue)} effect(s) could not be undone and "
                f"need a human: {', '.join(settled.residue)}"
            )
            undone = cause, consequence
    failed_keys: dict[str, BaseException | None] = {}
    if incomplete is not None:
        settlement = incomplete.settlement
        errors = getattr(settlement, "errors", {})
        failed_keys = {k: errors.get(k) for k in getattr(settlement, "failed_applies", ())}
    out = []
    for i, (call, result) in enumerate(zip(calls, turn.results, strict=True)):
        if isinstance(result, Failed):
            text = f"Error: {result.text}"
            if undone is not None:
                cause, consequence = undone
                also = "" if i == turn.failed and turn.dead is None else f" Also, {cause}."
                text += f".{also} {consequence}."
        elif undone is not None:
            cause, consequence = undone
            if result is None:
                text = f"Error: not run: {cause}. {consequence}."
            else:
                text = f"Error: undone: {call.name} ran, but {cause}. {consequence}."
        elif isinstance(result, Ack):
            if result.key in failed_keys:
                why = failed_keys[result.key]
                text = (
                    f"Error: the transaction committed, but this {result.status} effect did "
                    f"not take effect after retries: {type(why).__name__}: {why}"
                )
            else:
                text = _ack_text(result, committed)
        else:
            text = _result_text(result)
        out.append({"role": "tool", "tool_call_id": call.id, "content": text})
    return out


def _undone(
    calls: list[ToolCall], turn: Turn, boundary: str, on_error: str
) -> tuple[str, str] | None:
    """Why no call of the turn stands, as (cause, consequence) for the messages, or None if
    the calls that succeeded stand."""
    if turn.dead is not None:
        dead = turn.dead
        what = {
            "turn": "Nothing of this turn took effect",
            "task": "Nothing of this task took effect, this turn and earlier ones alike",
            "explicit": "Nothing done in that transaction took effect, this turn included",
        }[boundary]
        stale = (
            " (a stale read: the state changed meanwhile)" if dead.source == "stale_read" else ""
        )
        cause = f"the transaction was aborted: {dead.source}{stale}: {dead.detail}"
        return cause, f"{what} ({_UNDO}). Read the state again before you retry"
    if turn.failed is None or on_error == "commit":
        return None
    call = calls[turn.failed]
    if not turn.ran:
        where = "none of them was run"
    elif boundary == "turn":
        where = "the turn's transaction was aborted"
    else:
        where = "the turn was rolled back, and the transaction's earlier work stands"
    cause = f"call {call.id} ({call.name}) of this turn failed"
    undo = f" ({_UNDO})" if turn.ran else ""
    consequence = (
        f"No call of this turn took effect: {where}{undo}. Fix the failing call and make "
        "all of this turn's calls again"
    )
    return cause, consequence


def _ack_text(ack: Ack, committed: bool) -> str:
    if committed:
        note = (
            "the staged write was applied when this turn committed"
            if ack.status == "staged"
            else "the queued action was released when this turn committed"
        )
        return json.dumps({"status": "committed", "note": note})
    note = (
        "staged: it takes effect when the transaction commits"
        if ack.status == "staged"
        else "queued: it happens only when the transaction commits, never if it aborts"
    )
    return json.dumps({"status": ack.status, "note": note})


def _result_text(result: Any) -> str:
    return json.dumps(_plain(result), default=str, ensure_ascii=False)


def _plain(value: Any) -> Any:
    """Dataclasses and pydantic models as their fields, so that JSON carries them."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return dump(mode="json")
        except TypeError:
            return dump()
    return value
