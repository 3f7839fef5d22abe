"""What the proxy tells the client, and its log (stderr), about settlement.

A settled transaction becomes a `SettleReport` (text lines for people, `data()` for the
client's structured content); a deferred call is answered with an acknowledgement that says
it has NOT run yet; `atomix_status` shows the open transaction's effects and the last
report. docs/mcp-proxy.md shows these texts in use.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types

from atomix.decisions import Settlement
from atomix.effects import Effect, EffectClass
from atomix.handles import ATx
from atomix.tools import Ack, Call

from .tools import COMMIT, result_text

__all__ = [
    "DONE",
    "SettleReport",
    "SettledEffect",
    "ack_reply",
    "reply",
    "say",
    "settle_report",
    "status_reply",
]

#: How a settlement is said in a sentence ("it is committed").
DONE = {"commit": "committed", "abort": "aborted"}
# A settlement's list of keys -> the status a report gives the effects in it.
_STATUS_OF = (
    ("applied", "applied"),
    ("released", "released"),
    ("accepted", "kept"),
    ("compensated", "compensated"),
    ("dropped", "dropped"),
    ("residue", "residue"),
    ("failed_applies", "failed"),
)
_PENDING = {
    EffectClass.IRREVERSIBLE: "queued until commit",
    EffectClass.BUFFERABLE: "staged until commit",
    EffectClass.REVERSIBLE: "done; undone at abort",
}


@dataclass(slots=True)
class SettledEffect:
    """What became of one effect when its transaction settled."""

    tool: str
    effect: str
    key: str
    status: str  # applied | released | kept | compensated | dropped | residue | failed
    detail: str = ""


@dataclass(slots=True)
class SettleReport:
    """How one transaction settled, for the client and the log. `clean` is False exactly
    when an effect is residue (an undo failed) or failed (a delivery did not land), and
    then `lines()` says so."""

    txid: int
    outcome: str  # committed | aborted
    why: str
    effects: list[SettledEffect] = field(default_factory=list)
    abort_source: str | None = None
    detail: str = ""

    @property
    def clean(self) -> bool:
        return not any(e.status in ("residue", "failed") for e in self.effects)

    def lines(self) -> list[str]:
        head = f"transaction {self.txid} {self.outcome} ({self.why})"
        if self.outcome == "aborted" and self.abort_source:
            head += f": {self.abort_source}" + (f", {self.detail}" if self.detail else "")
        if not self.effects:
            return [head + "; it had no effects"]
        out = [head + ":"]
        for e in self.effects:
            more = f": {e.detail}" if e.detail else ""
            out.append(f"  {e.tool} ({e.effect}) {e.status} [key {e.key}]{more}")
        if not self.clean:
            out.append("  NOT CLEAN: see the residue/failed lines above")
        return out

    def data(self) -> dict[str, Any]:
        return {
            "transaction": self.txid,
            "outcome": self.outcome,
            "why": self.why,
            "abort_source": self.abort_source,
            "clean": self.clean,
            "effects": [
                {"tool": e.tool, "effect": e.effect, "key": e.key, "status": e.status, "detail": e.detail}
                for e in self.effects
            ],
        }


def settle_report(
    txid: int,
    effects: Sequence[Effect],
    settlement: Settlement | None,
    why: str,
    delivered: Mapping[str, types.CallToolResult],
) -> SettleReport:
    """The report of transaction `txid`: each of `effects` with its status in `settlement`
    (an aborted transaction with no settlement has unknown ones) and, as its detail, the
    error it met or else the upstream server's answer to its delivery (`delivered`, by key)."""
    s = settlement
    outcome = s.outcome if s is not None else "aborted"
    report = SettleReport(
        txid, outcome, why, abort_source=s.abort_source if s else None, detail=s.detail if s else ""
    )
    status: dict[str, str] = {}
    if s is not None:
        for attr, label in _STATUS_OF:
            for key in getattr(s, attr):
                status[key] = label
    for effect in effects:
        label = status.get(effect.key, "unknown")
        detail = ""
        answer = delivered.get(effect.key)
        if s is not None and effect.key in s.errors:
            error = s.errors[effect.key]
            detail = _one_line(f"{type(error).__name__}: {error}")
        elif answer is not None:
            detail = _one_line(result_text(answer))
        report.effects.append(
            SettledEffect(effect.tool, effect.effect_class.value, effect.key, label, detail)
        )
    return report


def reply(text: str, *, error: bool = False, data: Any = None) -> types.CallToolResult:
    """A tool result for the client: `text`, and `data` as its structured content."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=data, is_error=error
    )


def ack_reply(tool: str, ack: Ack, *, explicit: bool, duplicate: bool) -> types.CallToolResult:
    """The answer to a deferred call: it has not run, when it will, and its key. `explicit`:
    the policy's boundary is explicit (the client commits); else the session's end does."""
    when = (
        f"when the transaction commits ({COMMIT})"
        if explicit
        else "when the transaction commits (at the end of this session)"
    )
    if ack.status == "queued":
        text = (
            f"{tool}: queued until commit, NOT executed yet. It is delivered once "
            f"{when}, and never if the transaction aborts. key: {ack.key}"
        )
    else:
        text = (
            f"{tool}: staged, NOT applied yet. It is applied {when}, and dropped if "
            f"the transaction aborts. key: {ack.key}"
        )
    if duplicate:
        text += " (the same key as an earlier call in this transaction: delivered once)"
    return reply(text, data={"atomix": {"status": ack.status, "key": ack.key, "tool": ack.tool}})


def status_reply(
    tx: ATx | None,
    last: SettleReport | None,
    *,
    age_s: float = 0.0,
    idle: tuple[str, float] | None = None,
) -> types.CallToolResult:
    """`atomix_status`: the open transaction `tx` (open for `age_s` seconds) with each of
    its effects, and `last`, the last report. `idle` is (what the time-out does, seconds
    left) when the policy has a time-out."""
    lines: list[str] = []
    data: dict[str, Any] = {"open": None, "last": last.data() if last else None}
    if tx is None:
        lines.append("no open transaction (the next call starts one)")
    else:
        pending = []
        for e in tx.staged.values():
            args = e.payload.args if isinstance(e.payload, Call) else e.payload
            pending.append(
                {
                    "tool": e.tool,
                    "effect": e.effect_class.value,
                    "state": _PENDING[e.effect_class],
                    "key": e.key,
                    "args": dict(args or {}),
                }
            )
        head = f"transaction {tx.txid} open for {age_s:.1f} s with {len(pending)} effect(s)"
        if idle is not None:
            then, left = idle
            head += f"; {then} after {max(left, 0):.1f} s more without a call"
        lines.append(head + (":" if pending else ""))
        lines += [
            f"  {p['tool']} ({p['effect']}) {p['state']} [key {p['key']}] args {json.dumps(p['args'], default=str)}"
            for p in pending
        ]
        data["open"] = {"transaction": tx.txid, "age_s": round(age_s, 3), "effects": pending}
    lines.append("last settled: " + ("none yet" if last is None else "\n".join(last.lines())))
    return reply("\n".join(lines), data=data)


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def say(message: str) -> None:
    """Write `message` to the proxy's log, each line prefixed; never fails."""
    # stderr: the client keeps the server's stderr as its log; stdout is the protocol.
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("".join(f"atomix mcp-proxy: {line}\n" for line in message.splitlines()))
        sys.stderr.flush()
