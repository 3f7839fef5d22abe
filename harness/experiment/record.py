"""The trial record: one JSON line of trials.jsonl per (config, mode, cell, trial).

`run_trial` writes it, the runner adds `config_hash`, and every reader (reports, paired
comparisons, `atomix show`, the paper's reproduction) reads it. This module is its one
definition; `docs/trial-record.schema.json` is its JSON Schema, generated from these types by
`python -m harness.experiment.record` (a test checks that the committed file is current).

Everything in a record is a function of (config, mode, cell, trial, seed) except `timings`,
which holds wall-clock measurements: two runs of one config give records that are equal once
`timings` is dropped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NotRequired

# typing_extensions: pydantic reads TypedDicts for the JSON Schema only from it before 3.12.
from typing_extensions import TypedDict

__all__ = [
    "AgentBudgetRecord",
    "AgentRecord",
    "BudgetRecord",
    "Exercised",
    "FaultRecord",
    "GoalDiffEntry",
    "Metrics",
    "ModeBudgetRecord",
    "RetryRecord",
    "TrialRecord",
    "json_schema",
]


class FaultRecord(TypedDict):
    """One injected fault, read by the oracle and the tables only (never by a mode)."""

    index: int  # ordinal among every event the injector decided, faulted or not
    agent: str  # the agent whose delivery it was ("a0", ...)
    point: str  # "call" or "compensate"
    role: str  # "call" (the call's own effect or read) or "try" (tcc's reservation round trip)
    site: str
    fault: str  # the fault class, F1..F5
    occurrence: int  # how many times this agent had asked about this (point, role, site) before
    meta: dict[str, Any]


class Metrics(TypedDict):
    """The oracle's verdict and the counts every workload has. A workload may add measures
    of its own (e.g. `integration_loc`), and an agent kind its own (e.g. token counts)."""

    goal: bool
    invariant_violations: int
    stale_commits: int
    duplicates: int
    leaks: int
    residue: int
    unclassified_residue: int
    serialisable: bool
    clean: bool
    residue_free: bool
    reported_residue: int
    residue_mismatch: bool
    leaked: bool
    committed: int
    agents: int
    attempts: int
    steps: int
    budget_exhausted: int
    aborts: int
    wait_ms: float  # mean simulated ms an agent was blocked
    blocked: float  # fraction of agents that were blocked at all
    makespan_ms: float  # simulated
    stuck: int


class Exercised(TypedDict):
    """What the trial exercised, so that a table can say `n/a (not exercised)`."""

    faults: dict[str, int]  # per class, all five, zeros included
    faults_total: int
    aborts: int
    compensations: int
    irreversible_calls: int
    sends: int
    fault_classes: list[str]  # the classes the cell asked for
    faults_armed: bool  # the cell's fault rate is above zero


class AgentRecord(TypedDict):
    """One agent of the trial. An LLM agent adds its conversation, tool calls and usage."""

    agent: str
    task: str
    committed: bool
    attempts: int
    aborts: list[Any]
    failure: str | None
    blocked_ms: float
    steps: int
    reactions: list[Any]


class ModeBudgetRecord(TypedDict):
    """Deliveries in all of one effect the mode makes below the agent, by kind (0: the
    mechanism has no such step); see harness.modes.base.RetryBudget."""

    call: int  # of one call, when the agent makes it
    apply: int  # of one buffered or gated effect at commit, under its key (Atomix)
    confirm: int  # of one confirm at commit, under its key (TCC)
    resend: int  # of one gated send at commit, without a key (mutex-wal)


class AgentBudgetRecord(TypedDict):
    """The agent's own retry bounds; see harness.agents.budget.AgentBudget."""

    kind: str
    step_retries: int | None  # gold's retries of a failed call; None: decided each time
    max_attempts: int  # attempts at the whole plan (restarts, resumes)
    max_steps: int | None  # tool calls in all (None: unlimited)
    wrapper_retries: int  # retries of a failed call below the agent, for this mode


class BudgetRecord(TypedDict):
    """What the trial allowed: the mode's delivery budget, the agent's, and the bounds the
    config's `retries:` section set for every mode ({}: each mode at its native bounds)."""

    mode: ModeBudgetRecord
    agent: AgentBudgetRecord
    retries: dict[str, int]


class RewardRecord(TypedDict):
    """The task's own reward, for workloads that have one (tau_retail: tau2's components).
    `components` maps each component to True (met), False (not met), None (not applicable to
    this agent or task) or a string (not judged, and why: e.g. one that needs an LLM judge,
    which is never counted); `passed` is True when no component is False; `failed` names the
    components that are False."""

    passed: bool
    components: dict[str, bool | str | None]
    failed: list[str]


class GoalDiffEntry(TypedDict):
    """One place where a trial's final state differs from its goal (harness.world.statediff):
    a dotted path (`retail.orders.#W2378156.status`), the goal's value and the final one
    ("<absent>": no such key; long values cut). A last entry `{"path": "...", "more": N}`
    says N more were left out."""

    path: str
    gold: NotRequired[Any]
    final: NotRequired[Any]
    more: NotRequired[int]


class RetryRecord(TypedDict):
    """Set on a record that `atomix run --retry-failed` wrote in place of an errored one
    (harness.experiment.retry): which attempt at the trial it is (2: the first retry), the
    attempt it replaced, when (UTC), and that attempt's error. The replaced record is kept
    in the run's trials.retried.jsonl."""

    attempt: int
    replaces: int
    at: str
    error: str


class TrialRecord(TypedDict):
    """One trial: what ran, what the oracle found, what it exercised, what each agent did."""

    key: str  # config/mode/cell_id/trial: unique within a run
    config: str
    workload: str
    mode: str
    cell_id: str
    cell: dict[str, Any]
    trial: int
    seed: int
    faults: list[FaultRecord]
    metrics: Metrics
    exercised: Exercised
    agents: list[AgentRecord]
    budget: BudgetRecord  # the retry budgets the mode and the agent ran with
    final: dict[str, Any]  # the workload's digest of the final state (e.g. a DB hash)
    # The version of the workload's data, when it has one (tau workloads: which tau2 task set
    # and the sha256 prefixes of its files; harness.workloads.retail.data.tau2_data_version).
    data_version: NotRequired[str]
    timings: dict[str, Any]  # wall clock: the only part that differs between identical runs
    config_hash: NotRequired[str]  # added by the runner when it writes the record
    reward: NotRequired[RewardRecord]  # the workload's task reward, when it has one
    retry: NotRequired[RetryRecord]  # a retry of an errored trial (atomix run --retry-failed)
    # Where the final state differs from the goal ([] when reached); records written before
    # it was stored lack it.
    goal_diff: NotRequired[list[GoalDiffEntry]]


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a trial record (draft 2020-12, as pydantic writes it)."""
    from pydantic import TypeAdapter

    schema = TypeAdapter(TrialRecord).json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Atomix trial record"
    return schema


SCHEMA_PATH = Path("docs") / "trial-record.schema.json"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else SCHEMA_PATH
    out.write_text(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
