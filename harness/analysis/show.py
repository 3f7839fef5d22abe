"""`atomix show RUN [TRIAL]`: one trial's timeline of calls, faults and settlement.

A record keeps counts, not the calls themselves. Every trial is reproducible from its config,
mode, cell, index and seed, so `show` runs the trial again from the run's own resolved config
(manifest.json) with tracing on, checks that the replay gives the stored record, and prints
what happened below the shims: each delivery the substrates saw, in order, with the faults
injected at each call, then each agent's settlement and the oracle's metrics.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import RunError
from harness.experiment.config import validate_config
from harness.experiment.record import TrialRecord
from harness.experiment.rundir import read_manifest
from harness.experiment.runner import plan, read_records
from harness.experiment.trial import TrialTrace, run_trial


class ShowError(Exception):
    """The run or the trial cannot be shown; the message says why and what to type."""


@dataclass(frozen=True)
class Replay:
    """A stored trial record, the record its replay gave, and the replay's trace."""

    record: dict[str, Any]
    replayed: dict[str, Any]
    trace: TrialTrace

    @property
    def differences(self) -> list[str]:
        """Top-level fields (timings aside) where the replay differs from the record."""
        # timings are wall-clock; config_hash is stamped by the runner when it writes a record.
        keys = (set(self.record) | set(self.replayed)) - {"timings", "config_hash"}
        return sorted(k for k in keys if self.record.get(k) != self.replayed.get(k))


def resolve(run_dir: Path) -> Path:
    """A run directory, or a config's directory under results (-> its latest run)."""
    if (run_dir / "trials.jsonl").is_file():
        return run_dir
    runs = sorted(p.parent for p in Path(run_dir).glob("*/trials.jsonl"))
    if runs:
        return runs[-1]
    raise ShowError(f"{run_dir}: not a run directory (no trials.jsonl) and holds no runs")


def records_of(run_dir: Path) -> list[TrialRecord]:
    return read_records(run_dir / "trials.jsonl")


def find_trial(records: Sequence[dict[str, Any]], selector: str) -> dict[str, Any]:
    """The record `selector` names: its line number in trials.jsonl (1-based), its full key,
    or a part of its key that only one record has (e.g. `saga/fp=0.3/4`)."""
    if selector.isdigit():
        n = int(selector)
        if not 1 <= n <= len(records):
            raise ShowError(f"trial {n}: the run has trials 1..{len(records)}")
        return records[n - 1]
    exact = [r for r in records if r.get("key") == selector]
    if exact:
        return exact[0]
    found = [r for r in records if selector in str(r.get("key", ""))]
    if len(found) > 1:  # `saga/fp=0.3/4` names trial 4, not also trials 40-49: prefer a whole tail
        tail = [r for r in found if str(r.get("key", "")).endswith("/" + selector.lstrip("/"))]
        found = tail or found
    if len(found) == 1:
        return found[0]
    if not found:
        raise ShowError(f"no trial's key contains {selector!r} (see `atomix show RUN` for the keys)")
    sample = ", ".join(str(r["key"]) for r in found[:5])
    raise ShowError(f"{len(found)} trials match {selector!r}, e.g. {sample}: say more of the key")


def replay(run_dir: Path, record: dict[str, Any]) -> Replay:
    """Run `record`'s trial again from the run's resolved config, with tracing."""
    manifest_path = run_dir / "manifest.json"
    try:
        # read_manifest gives the grid in the order the run's cell ids name its keys.
        data = read_manifest(run_dir)["config"]
    except RunError as exc:
        raise ShowError(f"{manifest_path}: cannot read the run's config ({exc})") from None
    config = validate_config(data, manifest_path)
    specs = [s for s in plan(config) if s.key == record.get("key")]
    if not specs:
        raise ShowError(f"trial {record.get('key')!r} is not in the plan of {manifest_path}")
    trace: list[TrialTrace] = []
    replayed = run_trial(specs[0], trace=trace)
    return Replay(record, replayed, trace[0])


def _step(site: str) -> tuple[str, int]:
    agent, _, step = site.rpartition("/")
    return agent, int(step) if step.isdigit() else -1


def timeline(trace: TrialTrace) -> list[str]:
    """One line per delivery, in the order the substrates saw them, with each injected
    fault placed before the first delivery of its call (or after its agent's earlier calls,
    for a call that never delivered: an F1, or a stall cut short)."""
    events: list[tuple[str, dict[str, Any] | Any]] = [("op", op) for op in trace.ops]
    for fault in trace.faults:
        site = str(fault.get("site", ""))
        at = next(
            (i for i, (kind, op) in enumerate(events) if kind == "op" and op.meta.get("op") == site),
            None,
        )
        if at is None:
            agent, step = _step(site)
            at = len(events)
            for i, (kind, op) in enumerate(events):
                if kind != "op":
                    continue
                other_agent, other_step = _step(str(op.meta.get("op", "")))
                if other_agent == agent and other_step > step:
                    at = i
                    break
        events.insert(at, ("fault", fault))
    lines = []
    for kind, item in events:
        if kind == "fault":
            where = "call" if item["point"] == "call" else f"{item['point']} of call"
            lines.append(f"  !! {item['fault']} injected on {where} {item['site']}")
            continue
        op = item
        who = op.meta.get("op") or op.meta.get("agent") or "(setup)"
        undo = " (compensation)" if op.meta.get("undo") else ""
        key = f"  key {op.key}" if op.key else ""
        # The trial's temporary directory differs on every run: show it as "<trial>".
        scope = op.scope.replace(os.path.realpath(trace.workdir), "<trial>")
        lines.append(f"  {op.seq:>4}  {who:<22} {op.substrate:<8} {op.kind:<8} {scope}{undo}{key}")
    return lines


def render(replay_: Replay) -> list[str]:
    """The whole `show` text for one trial."""
    record = replay_.record
    out = [
        f"trial {record['key']}  (workload {record['workload']}, seed {record['seed']})",
        "",
        "calls as the substrates saw them (seq, call, substrate, kind, scope):",
        *(timeline(replay_.trace) or ["  (no delivery reached a substrate)"]),
    ]
    if replay_.trace.messages:
        out += ["", f"mail sink: {len(replay_.trace.messages)} message(s)"]
    out += ["", "settlement per agent:"]
    for agent in record.get("agents", []):
        state = "committed" if agent.get("committed") else "did not commit"
        aborts = ", ".join(map(str, agent.get("aborts") or [])) or "none"
        line = (
            f"  {agent['agent']} {agent.get('task')}: {state} after {agent.get('attempts')} "
            f"attempt(s), {agent.get('steps')} step(s); aborts: {aborts}"
        )
        if agent.get("failure"):
            line += f"; failure: {agent['failure']}"
        out.append(line)
        reactions = agent.get("reactions") or []
        if reactions:
            out.append(f"     reactions: {', '.join(map(str, reactions))}")
        llm = agent.get("llm")
        if llm:  # a model's conversation: what it called, and what became of each call
            usage = llm.get("usage", {})
            out.append(
                f"     model: {usage.get('requests')} request(s), {usage.get('prompt_tokens')} "
                f"prompt + {usage.get('completion_tokens')} completion tokens; stopped: {llm.get('stop')}"
            )
            for call in llm.get("tool_calls", []):
                args = json.dumps(call.get("arguments"), ensure_ascii=False)
                args = args if len(args) <= 80 else args[:77] + "..."
                out.append(f"     call {call.get('name')}({args}) -> {call.get('outcome')}")
            answer = next((m.get("content") for m in reversed((llm.get("conversations") or [[]])[-1])
                           if m.get("role") == "assistant" and not m.get("tool_calls")), None)
            if answer:
                out.append(f"     answer: {answer.strip()[:200]}")
    metrics = record.get("metrics", {})
    out += ["", "oracle: " + ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(metrics.items()))]
    diff = replay_.differences
    out += [
        "",
        "replay: identical to the stored record"
        if not diff
        else f"replay DIFFERS from the stored record in: {', '.join(diff)}",
    ]
    return out


def summary(records: Iterable[dict[str, Any]], limit: int = 20) -> list[str]:
    """The first `limit` trials of a run, one line each, to pick one to show."""
    rows = list(records)
    out = [f"{len(rows)} trial(s); show one with `atomix show RUN N` or a part of its key:"]
    for n, r in enumerate(rows[:limit], 1):
        m = r.get("metrics", {})
        faults = len(r.get("faults") or [])
        out.append(f"  {n:>5}  {r.get('key')}  clean={m.get('clean')}  faults={faults}")
    if len(rows) > limit:
        out.append(f"  ... {len(rows) - limit} more")
    return out


def _fmt(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)
