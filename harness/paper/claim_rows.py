"""The rows of the claims table: the paper's claims, the mechanism components of tx-full,
the metrics that measure them (with the direction that is better), and one `ClaimRow` per
(claim, component, workload) with the ablation that removes only that component. Adding a
row is one line of `ROWS`; `check_rows` refuses a row that names an unknown mode, config,
metric or cell before anything runs. `harness.paper.claims` measures them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.analysis.records import REQUIRES
from harness.analysis.table import NOT_EXERCISED_TEXT
from harness.experiment.cells import cell_id, expand_cells
from harness.experiment.config import ExperimentConfig
from harness.modes.registry import MODES

FULL = "tx-full"
ALPHA = 0.05

SUPPORTED = "supported"
CONTRADICTED = "contradicted"
NOT_SUPPORTED = "not supported on our workloads"
VERDICTS: tuple[str, ...] = (SUPPORTED, CONTRADICTED, NOT_SUPPORTED, NOT_EXERCISED_TEXT)

# --------------------------------------------------------------------------- vocabulary

CLEAN = "clean recovery under faults"
CONTENDING = "contending work isolated"
SPECULATIVE = "speculative work isolated"
NO_LEAK = "irreversible actions never leak"
DISJOINT = "timeliness: disjoint work never waits"
ORDER = "timeliness: conflicting work settles in epoch order"
#: The paper's claims, in the order the table shows them.
CLAIMS: tuple[str, ...] = (CLEAN, CONTENDING, SPECULATIVE, NO_LEAK, DISJOINT, ORDER)

GATE = "irreversible gate"
KEYS = "keyed re-delivery"
COMPENSATION = "compensation at abort"
READS = "scope-on-read with abort-on-stale"
FRONTIER = "per-resource frontier"
SEAL = "seal"
#: The mechanism components of tx-full that the rows remove one at a time.
COMPONENTS: tuple[str, ...] = (GATE, KEYS, COMPENSATION, READS, FRONTIER, SEAL)


@dataclass(frozen=True)
class Metric:
    """A metric a row may compare: which direction is good, and what it counts."""

    better: str  # "higher" | "lower"
    text: str


#: Every metric a row may use: its good direction and what it measures (shown in claims.md).
METRICS: dict[str, Metric] = {
    "clean": Metric("higher", "share of trials judged clean by the oracle (goal reached; no "
                    "invariant violation, stale commit, leak, duplicate or unreported residue)"),
    "residue": Metric("lower", "effects of uncommitted attempts left applied, per trial"),
    "duplicates": Metric("lower", "applications of one logical call beyond the first, per trial"),
    "leaks": Metric("lower", "mails in the sink for an attempt that did not commit, per trial"),
    "leaked": Metric("lower", "share of trials whose aborted send reached the sink"),
    "invariant_violations": Metric("lower", "invariant violations of the final state, per run"),
    "contamination_mailbox": Metric("lower", "mails of losing branches in the mailbox, per "
                                    "1,000 losing transactions"),
    "contamination_booking": Metric("lower", "booking holds of losing branches left, per "
                                    "1,000 losing transactions"),
    "wait_ms": Metric("lower", "average wait per task, simulated ms"),
    "needless_wait_ms": Metric("lower", "mean wait per agent where nothing conflicts (all of "
                               "it needless), simulated ms"),
    "order_violations": Metric("lower", "contended items whose unit went to a customer other "
                               "than the earliest arrival, per run"),
}  # fmt: skip


@dataclass(frozen=True)
class ClaimRow:
    """One line of the claims table: `claim` tested by removing `component` from tx-full
    (the mode `ablation`), on the trials of config `config` (its file stem) pooled over
    `cells` (cell ids; empty: every cell), compared on `metric` (a metric of `METRICS` that
    one of the config's report tables shows). `requires` is what must have occurred in the
    pooled trials for the row to be a result (`harness.analysis.records.REQUIRES`; None:
    the default rule, a fault-armed cell must have had a fault)."""

    claim: str
    component: str
    ablation: str
    config: str
    metric: str
    cells: tuple[str, ...] = ()
    requires: str | None = None

    @property
    def workload(self) -> str:
        return self.config if not self.cells else f"{self.config} ({', '.join(self.cells)})"


_R = ClaimRow
_FAULTED = ("fp=0.1", "fp=0.3")
_MIXED = ("faults=mixed-0.10", "faults=mixed-0.30")
_STRESS_DUP = ("faults=F2-0.10", "faults=F4-0.10")
_CONTENDED = ("cell=contended", "cell=contended-mixed-0.10")
_DISJOINT = ("cell=disjoint",)

#: The rows, grouped by claim. A component appears where one of our workloads exercises it.
ROWS: list[ClaimRow] = [
    _R(CLEAN, KEYS, "tx-unkeyed", "tau_retail", "clean", _FAULTED),
    _R(CLEAN, KEYS, "tx-unkeyed", "tau_stress", "duplicates", _STRESS_DUP),
    _R(CLEAN, COMPENSATION, "tx-no-compensation", "tau_retail", "residue", _FAULTED),
    _R(CLEAN, GATE, "tx-no-gate", "tau_retail_notify", "clean", _FAULTED),
    _R(CLEAN, FRONTIER, "no-frontier", "tau_stress", "clean", _MIXED),
    _R(CLEAN, SEAL, "tx-no-seal", "tau_stress", "clean", _MIXED),
    _R(CONTENDING, READS, "tx-no-read-checks", "tau_contention", "invariant_violations"),
    _R(CONTENDING, READS, "tx-no-scope-on-read", "tau_contention", "invariant_violations"),
    _R(CONTENDING, READS, "tx-no-abort-on-stale", "tau_contention", "invariant_violations"),
    _R(CONTENDING, READS, "tx-no-read-checks", "tau_stress", "invariant_violations", _MIXED),
    _R(CONTENDING, FRONTIER, "no-frontier", "tau_contention", "invariant_violations"),
    _R(CONTENDING, COMPENSATION, "tx-no-compensation", "tau_contention", "invariant_violations"),
    _R(CONTENDING, SEAL, "tx-no-seal", "tau_contention", "invariant_violations"),
    _R(SPECULATIVE, GATE, "tx-no-gate", "speculation_contamination", "contamination_mailbox"),
    _R(SPECULATIVE, COMPENSATION, "tx-no-compensation", "speculation_contamination",
       "contamination_booking"),
    _R(NO_LEAK, GATE, "tx-no-gate", "leakage", "leaked", requires="irreversible_calls"),
    _R(NO_LEAK, GATE, "tx-no-gate", "tau_retail_notify", "leaks", _FAULTED, "irreversible_calls"),
    _R(NO_LEAK, KEYS, "tx-unkeyed", "tau_retail_notify", "duplicates", _FAULTED),
    _R(DISJOINT, FRONTIER, "tx-global-frontier", "tau_disjoint", "wait_ms"),
    _R(DISJOINT, FRONTIER, "tx-global-frontier", "epoch_order", "needless_wait_ms", _DISJOINT),
    _R(ORDER, FRONTIER, "no-frontier", "epoch_order", "order_violations", _CONTENDED),
    _R(ORDER, FRONTIER, "tx-global-frontier", "epoch_order", "order_violations", _CONTENDED),
    _R(ORDER, READS, "tx-no-read-checks", "epoch_order", "order_violations", _CONTENDED),
    _R(ORDER, SEAL, "tx-no-seal", "epoch_order", "order_violations", _CONTENDED),
]  # fmt: skip


# --------------------------------------------------------------------------- checking


def check_rows(
    rows: Sequence[ClaimRow],
    configs: Mapping[str, ExperimentConfig],
) -> list[str]:
    """Every problem of `rows` against the mode registry, `METRICS`, the claims and
    components, and the loaded `configs` (by name): an unknown config, a metric that none
    of the config's report tables shows (or whose table says the other direction is better),
    a cell the config does not have."""
    problems: list[str] = []
    seen: set[tuple[str, str, str, str, tuple[str, ...]]] = set()
    for i, row in enumerate(rows):
        where = f"claims row {i} ({row.claim} / {row.component} / {row.config})"
        if row.claim not in CLAIMS:
            problems.append(f"{where}: unknown claim {row.claim!r}; allowed: {list(CLAIMS)}")
        if row.component not in COMPONENTS:
            problems.append(
                f"{where}: unknown component {row.component!r}; allowed: {list(COMPONENTS)}"
            )
        if row.ablation not in MODES or row.ablation == FULL:
            problems.append(
                f"{where}: ablation {row.ablation!r} is not a registered mode other than "
                f"{FULL}; registered: {', '.join(MODES)}"
            )
        if row.metric not in METRICS:
            problems.append(f"{where}: metric {row.metric!r} has no direction in METRICS")
        if row.requires is not None and row.requires not in REQUIRES:
            problems.append(f"{where}: requires {row.requires!r}; allowed: {list(REQUIRES)}")
        key = (row.claim, row.ablation, row.config, row.metric, row.cells)
        if key in seen:
            problems.append(f"{where}: the same comparison is listed twice")
        seen.add(key)
        config = configs.get(row.config)
        if config is None:
            problems.append(f"{where}: no config named {row.config!r}")
            continue
        shown = [t.metric for t in config.report.tables]
        if row.metric not in shown:
            problems.append(
                f"{where}: metric {row.metric!r} is in none of {row.config}'s report tables "
                f"({', '.join(shown)})"
            )
        said = {t.better for t in config.report.tables if t.metric == row.metric} - {None}
        if row.metric in METRICS and said - {METRICS[row.metric].better}:
            problems.append(
                f"{where}: {row.config}'s report says {row.metric!r} is better "
                f"{'/'.join(sorted(str(b) for b in said))}, METRICS says "
                f"{METRICS[row.metric].better}"
            )
        ids = [cell_id(config, c) for c in expand_cells(config)]
        for c in row.cells:
            if c not in ids:
                problems.append(f"{where}: {row.config} has no cell {c!r}; it has {ids}")
    return problems
