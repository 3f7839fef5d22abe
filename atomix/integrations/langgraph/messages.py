"""What a node run's ToolMessages say once its transaction settled: which calls failed, what
became of each effect, and the `response_metadata["atomix"]` stamp (txid, outcome)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.types import Command

from atomix.effects import EffectClass
from atomix.integrations.langgraph.tool import AtomixTool


def tool_messages(out: Any, key: str) -> Iterator[ToolMessage]:
    """Every ToolMessage in a ToolNode output, whatever its shape (a list, {key: [...]}, a list
    mixing Commands with those)."""
    if isinstance(out, ToolMessage):
        yield out
    elif isinstance(out, list | tuple):
        for item in out:
            yield from tool_messages(item, key)
    elif isinstance(out, dict):
        yield from tool_messages(out.get(key, ()), key)
    elif isinstance(out, Command) and out.update is not None:
        yield from tool_messages(out.update, key)


def failures(out: Any, key: str) -> list[ToolMessage]:
    """The messages of the calls that failed (status "error")."""
    return [m for m in tool_messages(out, key) if m.status == "error"]


def why_failed(failed: list[ToolMessage]) -> str:
    """The abort detail of a turn whose calls `failed`."""
    calls = ", ".join(f"{m.tool_call_id!r} ({m.name})" for m in failed)
    return f"tool call(s) {calls} failed"


def stamp(msg: ToolMessage, txid: int, outcome: str, boundary: str) -> None:
    """Record on the message which transaction its call ran in and what became of it."""
    msg.response_metadata = {
        **(msg.response_metadata or {}),
        "atomix": {"txid": txid, "outcome": outcome, "boundary": boundary},
    }


def say_settled(msg: ToolMessage, txid: int) -> None:
    """A deferred call's message, once its turn committed: it now says that it took effect."""
    ack = msg.artifact if isinstance(msg.artifact, dict) else None
    if ack is None or msg.status == "error" or ack.get("status") not in ("staged", "queued"):
        return
    done = "applied" if ack["status"] == "staged" else "released"
    msg.content = f"done: {ack['tool']} {done} when transaction {txid} committed"


_UNDONE = {
    EffectClass.BUFFERABLE: "its write was dropped before it reached anything",
    EffectClass.REVERSIBLE: "its effect was compensated",
    EffectClass.IRREVERSIBLE: "it never left the gate",
    None: "it changed nothing itself",
}


def say_aborted(
    out: Any,
    key: str,
    tools: dict[str, BaseTool],
    failed: list[ToolMessage],
    what: str,
    why: str | None,
) -> None:
    """Rewrite a turn's messages after its transaction aborted: every call is an error now,
    and each says what became of its effect."""
    reason = f"{what}: {why}" if why else what
    failed_ids = {id(m) for m in failed}
    for msg in tool_messages(out, key):
        if id(msg) in failed_ids:
            msg.content = f"{_text(msg.content)}\n({reason}; no effect of it remains.)"
        else:
            tool = tools.get(msg.name or "")
            effect = tool.spec.effect if isinstance(tool, AtomixTool) else None
            msg.content = (
                f"rolled back: {reason}, so this call was undone: {_UNDONE[effect]}. "
                f"It had returned: {_text(msg.content)}"
            )
        msg.status = "error"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in content]
    return " ".join(p for p in parts if p)
