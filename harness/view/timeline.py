"""One trial's timeline for the trial page, and two trials aligned call by call.

A record keeps counts; the calls themselves come from replaying the trial with tracing
(`harness.analysis.show.replay`, checked against the stored record, as `atomix show` does):
the agents' calls through the mode with their arguments, results and errors
(`harness.experiment.calltrace`), the injected faults placed on the step during which each
was drawn, the policy's reaction to each failed call, the substrate operations each step
caused (commit-time applies, releases at the gate, compensations), and where the final state
differs from the goal. An LLM trial is not replayed unless asked (its replay needs the
model's answers, from the completion cache or the server); its page is built from the
record, which holds the conversation and every tool call.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis.show import ShowError, replay
from harness.errors import RunError
from harness.experiment.config import ConfigError

__all__ = ["Aligned", "TrialView", "align", "trial_view"]

# Substrate ops that make no change the reader needs to see on a step (reads are implied by
# a read call's result).
_QUIET_OPS = frozenset({"read"})


@dataclass
class TrialView:
    """What the trial page shows. `entries` is the timeline in virtual-time order; `source`
    says where it came from ("replay", or "record" with `note` saying why not a replay)."""

    record: dict[str, Any]
    entries: list[dict[str, Any]] = field(default_factory=list)
    unplaced_faults: list[dict[str, Any]] = field(default_factory=list)
    goal_diff: list[dict[str, Any]] = field(default_factory=list)
    source: str = "record"
    note: str = ""
    differences: list[str] = field(default_factory=list)
    conversations: list[dict[str, Any]] = field(default_factory=list)


def _op_label(op: Any, during: str, effect_by_op: dict[str, str]) -> str:
    meta = op.meta or {}
    if meta.get("undo"):
        return "compensation"
    if op.kind == "dedup":
        return "duplicate dropped by key"
    if during == "commit":
        effect = effect_by_op.get(str(meta.get("op")), "")
        if effect == "irreversible" or op.substrate in ("mail", "sink"):
            return "released from the gate"
        return "applied at commit"
    if during == "abort":
        return "undone at abort"
    return f"{op.kind} applied now"


def _op_dict(op: Any, label: str, workdir: str) -> dict[str, Any]:
    scope = str(op.scope).replace(os.path.realpath(workdir), "<trial>") if workdir else str(op.scope)
    return {"seq": op.seq, "substrate": op.substrate, "kind": op.kind, "scope": scope,
            "key": op.key, "label": label, "op": (op.meta or {}).get("op")}


def _from_trace(view: TrialView, trace: Any) -> None:
    faults = sorted(trace.faults, key=lambda f: int(f.get("index", 0)))
    ops = list(trace.ops)
    effect_by_op = {str(e.get("op")): str(e.get("effect")) for e in trace.calls if e["kind"] == "call"}
    placed: set[int] = set()
    entries: list[dict[str, Any]] = []
    for event in trace.calls:
        entry = dict(event)
        entry["faults"] = []
        entry["ops"] = []
        if "faults_from" in event:
            lo, hi = int(event["faults_from"]), int(event.get("faults_to", event["faults_from"]))
            for f in faults:
                i = int(f.get("index", -1))
                if lo <= i < hi and f.get("agent") == event.get("agent") and i not in placed:
                    entry["faults"].append(f)
                    placed.add(i)
        if "ops_from" in event:
            lo, hi = int(event["ops_from"]), int(event.get("ops_to", event["ops_from"]))
            for op in ops[lo:hi]:
                if (op.meta or {}).get("agent") not in (None, event.get("agent")):
                    continue
                if op.kind in _QUIET_OPS and not (op.meta or {}).get("undo"):
                    continue
                entry["ops"].append(_op_dict(op, _op_label(op, event["kind"], effect_by_op),
                                             trace.workdir))
        entries.append(entry)
    view.entries = entries
    view.unplaced_faults = [f for f in faults if int(f.get("index", -1)) not in placed]
    view.goal_diff = list(trace.goal_diff)


def _from_record(view: TrialView) -> None:
    """The timeline a record alone gives: an LLM agent's tool calls (arguments, outcome and
    the tool's answer from its conversation), with the faults listed by call."""
    record = view.record
    effects: dict[str, str] = {}
    try:
        from harness.workloads import get_workload

        for name, tool in get_workload(str(record.get("workload"))).tools.items():
            effects[name] = tool.effect.value if tool.effect is not None else "read"
    except Exception:  # noqa: BLE001 - an unknown workload: the effect column stays empty
        pass
    answers: dict[str, str] = {}
    for agent in record.get("agents") or []:
        for messages in (agent.get("llm") or {}).get("conversations") or []:
            for m in messages:
                if m.get("tool_call_id"):
                    answers[str(m["tool_call_id"])] = str(m.get("content"))
    by_site: dict[str, list[dict[str, Any]]] = {}
    for f in record.get("faults") or []:
        by_site.setdefault(str(f.get("site")), []).append(f)
    entries: list[dict[str, Any]] = []
    for agent in record.get("agents") or []:
        llm = agent.get("llm") or {}
        for call in llm.get("tool_calls") or []:
            site = str(call.get("op") or call.get("site") or "")
            outcome = call.get("outcome")
            entries.append({
                "kind": "call", "agent": agent.get("agent"), "attempt": call.get("attempt"),
                "t_ms": None, "op": site or None, "tool": call.get("name"),
                "effect": effects.get(str(call.get("name")), ""), "args": call.get("arguments"),
                "result": answers.get(str(call.get("id"))) if outcome == "ok" else None,
                "error": None if outcome in (None, "ok") else {
                    "kind": str(outcome), "message": answers.get(str(call.get("id")), "")},
                "faults": by_site.pop(site, []) if site else [], "ops": [],
            })
    view.entries = entries
    view.unplaced_faults = [f for fs in by_site.values() for f in fs]
    view.goal_diff = list(record.get("goal_diff") or [])


def _conversations(record: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for agent in record.get("agents") or []:
        llm = agent.get("llm") or {}
        for i, messages in enumerate(llm.get("conversations") or [], 1):
            out.append({"agent": agent.get("agent"), "attempt": i, "messages": messages,
                        "stop": llm.get("stop"), "usage": llm.get("usage")})
    return out


def is_llm(record: dict[str, Any]) -> bool:
    return any(a.get("llm") for a in record.get("agents") or [])


def trial_view(run_dir: Path, record: dict[str, Any], *, replay_llm: bool = False) -> TrialView:
    """The trial page's content for `record` of the run in `run_dir`."""
    view = TrialView(record=record, conversations=_conversations(record))
    if is_llm(record) and not replay_llm:
        view.note = ("built from the stored record (an LLM trial is replayed only on request: "
                     "its replay needs the model's answers in the completion cache or the server)")
        _from_record(view)
        return view
    try:
        result = replay(run_dir, record)
    except (ShowError, ConfigError, RunError, OSError) as exc:
        view.note = f"cannot replay this trial ({exc}); shown from the stored record"
        _from_record(view)
        return view
    except Exception as exc:  # a model server that is down, a changed workload, ...
        view.note = (f"the replay failed ({type(exc).__name__}: {exc}); shown from the stored "
                     "record")
        _from_record(view)
        return view
    view.source = "replay"
    view.differences = result.differences
    _from_trace(view, result.trace)
    if not view.goal_diff:
        view.goal_diff = list(record.get("goal_diff") or [])
    return view


# --------------------------------------------------------------------------- side by side


@dataclass
class Aligned:
    """Two trials' steps paired call by call: `rows` of (left entry | None, right entry |
    None, same), and the index of the first row where they part (None: they never do)."""

    rows: list[tuple[dict[str, Any] | None, dict[str, Any] | None, bool]]
    first_divergence: int | None


def _signature(entry: dict[str, Any]) -> str:
    if entry["kind"] == "call":
        return json.dumps(["call", entry.get("agent"), entry.get("op"), entry.get("tool"),
                           entry.get("args")], sort_keys=True, default=str)
    if entry["kind"] == "reaction":
        return json.dumps(["reaction", entry.get("agent"), entry.get("answers")])
    return json.dumps([entry["kind"], entry.get("agent")])


def _outcome(entry: dict[str, Any]) -> str:
    """What must also match for two aligned steps to be the same: how it ended, which faults
    were drawn on it, and the reaction chosen."""
    faults = sorted(str(f.get("fault")) for f in entry.get("faults") or [])
    err = (entry.get("error") or {}).get("kind") if entry.get("error") else None
    return json.dumps([err, faults, entry.get("reaction"), entry.get("outcome"),
                       entry.get("source")], default=str)


def align(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> Aligned:
    """Pair two timelines step by step (the longest common run of equal steps, by agent,
    call site, tool and arguments), marking the first step where they differ: one side has
    a step the other lacks, or an aligned step ended otherwise (another error, fault or
    reaction)."""
    steps_l = [e for e in left if e["kind"] != "begin"]
    steps_r = [e for e in right if e["kind"] != "begin"]
    sig_l = [_signature(e) for e in steps_l]
    sig_r = [_signature(e) for e in steps_r]
    rows: list[tuple[dict[str, Any] | None, dict[str, Any] | None, bool]] = []
    matcher = difflib.SequenceMatcher(None, sig_l, sig_r, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for a, b in zip(steps_l[i1:i2], steps_r[j1:j2], strict=True):
                rows.append((a, b, _outcome(a) == _outcome(b)))
            continue
        span = max(i2 - i1, j2 - j1)
        for k in range(span):
            a = steps_l[i1 + k] if i1 + k < i2 else None
            b = steps_r[j1 + k] if j1 + k < j2 else None
            rows.append((a, b, False))
    first = next((i for i, (_, _, same) in enumerate(rows) if not same), None)
    return Aligned(rows, first)
