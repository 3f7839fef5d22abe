"""Sensitivity of a run's verdicts to the llm-like agent's weights.

The llm-like agent (`harness.agents.policies.LlmLikePolicy`) is an assumption: its reaction
weights and probabilities are plausible, not measured. This module re-runs one config under
other plausible weights and says which conclusions survive:

* **designs**: the default weights; each weight at 50% and at 150% of its default, one at a
  time (a weight whose default is 0 stays 0: it is listed as not varied); and a small random
  design, every weight drawn uniformly in [0.5 w, 1.5 w] with a seeded rng. The reaction
  weights are relative, so after a change they are rescaled to their default total (the
  share of each is what changes); the probabilities (`forget_on_replan`, `intrinsic_error`)
  are capped at 1.
* **paired**: every design runs the same cells, seeds and trials (`--quick`: the first
  third of them), so the scenarios and fault draws are the same; only the agent differs.
* **what is compared**: the paired verdicts under the config's main table
  (`harness.analysis.verdicts.verdict_block`: each mode against the baseline per cell,
  `paired_compare` and `verdict`). A verdict's *stability* is the fraction of the other
  designs in which it reads the same as under the default weights. The *ranking* of modes
  is by the main metric over all trials of the design, and its agreement with the default
  ranking is Kendall's tau-b (scipy; `n/a` when either ranking is all ties).

Run it with `atomix sensitivity CONFIG.yaml [--quick] [--designs N] [--out DIR]`; it prints
how long it took. `sensitivity_markdown(result)` is the section a reproduction report embeds.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from scipy import stats as _sps

from harness.agents.policies import REACTION_KEYS, WEIGHT_KEYS, AgentConfig
from harness.analysis.runs import main_table, table_specs
from harness.analysis.verdicts import VerdictBlock, baseline_of, verdict_block
from harness.experiment.config import ExperimentConfig, load_config
from harness.experiment.executor import ExecutorOptions
from harness.experiment.executors import open_executor
from harness.experiment.runner import plan

__all__ = [
    "DEFAULT_DESIGNS",
    "MAX_DESIGNS",
    "QUICK_DESIGNS",
    "Design",
    "DesignResult",
    "SensitivityError",
    "SensitivityResult",
    "VerdictStability",
    "design_points",
    "designs_csv",
    "run_sensitivity",
    "sensitivity_csv",
    "sensitivity_markdown",
    "write_sensitivity",
]

#: Random design points by default, with --quick, and at most.
DEFAULT_DESIGNS = 12
QUICK_DESIGNS = 4
MAX_DESIGNS = 200
#: How far one-at-a-time moves a weight, and the random design's range: [LOW w, HIGH w].
LOW, HIGH = 0.5, 1.5
_PROBABILITIES = frozenset(WEIGHT_KEYS) - frozenset(REACTION_KEYS)
_NA = "n/a"


class SensitivityError(ValueError):
    """The config cannot be analysed (its agent is not llm-like, its main table compares no
    modes) or an option is out of range; the message says which and what is allowed."""


@dataclass(frozen=True)
class Design:
    """One point of the design: the agent's weights (every key of WEIGHT_KEYS)."""

    name: str  # "default", "retry x0.5", "retry x1.5", "random 01", ...
    kind: Literal["default", "one-at-a-time", "random"]
    weights: Mapping[str, float]


@dataclass(frozen=True)
class DesignResult:
    """What one design gave: its verdicts (in the default's row order), how many match the
    default's, the mode ranking and its Kendall tau-b against the default's."""

    design: Design
    verdicts: tuple[str, ...]
    matches: int
    scores: Mapping[str, float]  # mode -> the main metric over all the design's trials
    ranking: tuple[str, ...]  # best first
    tau: float  # nan: a ranking of ties only, nothing to correlate
    trials: int
    wall_s: float


@dataclass(frozen=True)
class VerdictStability:
    """One paired verdict of the main table (a mode against the baseline in one cell):
    what the default weights say and in how many other designs the same holds."""

    cell: str
    mode: str
    default: str  # the verdict under the default weights
    diff: float  # the default's paired difference (mode minus baseline)
    held: int  # designs (other than the default) with the same verdict
    designs: int  # designs other than the default
    changed_in: tuple[str, ...]  # the designs whose verdict differs, with what it read

    @property
    def exercised(self) -> bool:
        return not self.default.startswith(_NA)

    @property
    def stability(self) -> float:
        """held / designs; nan when the default's cell was not exercised or no design ran."""
        if not self.exercised or self.designs == 0:
            return math.nan
        return self.held / self.designs


@dataclass
class SensitivityResult:
    """Every design of one config and the stability of each of its verdicts."""

    config: str
    path: str
    metric: str
    better: str
    baseline: str
    table: str
    trials: int  # trials per cell and mode in every design
    quick: bool
    kind: str  # the metric's test: "binary" (yes/no) or "numeric"
    designs: list[DesignResult]  # the default first
    rows: list[VerdictStability]
    fixed: list[str]  # weights not varied (their default is 0)
    wall_s: float
    alpha: float = 0.05
    notes: list[str] = field(default_factory=list)

    @property
    def default(self) -> DesignResult:
        return self.designs[0]

    @property
    def others(self) -> list[DesignResult]:
        return self.designs[1:]

    @property
    def overall(self) -> float:
        """Mean stability over the verdicts whose cell was exercised (nan: none was)."""
        values = [r.stability for r in self.rows if not math.isnan(r.stability)]
        return sum(values) / len(values) if values else math.nan

    @property
    def all_hold(self) -> int:
        """Designs (other than the default) in which every verdict reads as the default's."""
        n = len(self.rows)
        return sum(1 for d in self.others if d.matches == n)

    def tau_summary(self) -> tuple[float, float]:
        """(mean, min) Kendall tau-b of the other designs' rankings against the default's,
        over the designs where it is defined; (nan, nan) when it never is."""
        taus = [d.tau for d in self.others if not math.isnan(d.tau)]
        if not taus:
            return math.nan, math.nan
        return sum(taus) / len(taus), min(taus)


# --------------------------------------------------------------------------- designs


def _seeded(seed: int, *parts: Any) -> random.Random:
    blob = "/".join(map(str, (seed, "sensitivity", *parts))).encode()
    return random.Random(int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "big"))


def _weights(agent: AgentConfig) -> dict[str, float]:
    return {k: float(getattr(agent, k)) for k in WEIGHT_KEYS}


def _normalised(weights: Mapping[str, float], default: Mapping[str, float]) -> dict[str, float]:
    """Reaction weights rescaled to the default's total (only their shares matter to the
    agent); probabilities capped at 1; every value rounded to 6 decimals (a config value)."""
    total = sum(weights[k] for k in REACTION_KEYS)
    target = sum(default[k] for k in REACTION_KEYS)
    out: dict[str, float] = {}
    for k in WEIGHT_KEYS:
        v = weights[k]
        if k in REACTION_KEYS and total > 0:
            v = v * target / total
        if k in _PROBABILITIES:
            v = min(1.0, v)
        out[k] = round(v, 6)
    return out


def design_points(agent: AgentConfig, designs: int, seed: int) -> tuple[list[Design], list[str]]:
    """The default, each nonzero weight at LOW and HIGH times its default one at a time, and
    `designs` random points; and the weights left fixed (a default of 0). Deterministic for
    (agent, designs, seed)."""
    default = _weights(agent)
    varied = [k for k in WEIGHT_KEYS if default[k] > 0]
    fixed = [k for k in WEIGHT_KEYS if default[k] <= 0]
    out = [Design("default", "default", _normalised(default, default))]
    for k in varied:
        for factor in (LOW, HIGH):
            moved = {**default, k: default[k] * factor}
            out.append(Design(f"{k} x{factor:g}", "one-at-a-time", _normalised(moved, default)))
    rng = _seeded(seed, "random")
    width = len(str(designs))
    for i in range(designs):
        drawn = {k: (rng.uniform(LOW * w, HIGH * w) if w > 0 else w) for k, w in default.items()}
        out.append(Design(f"random {i + 1:0{width}d}", "random", _normalised(drawn, default)))
    return out, fixed


# --------------------------------------------------------------------------- running


def _ranking(
    records: Sequence[Mapping[str, Any]], metric: str, modes: Sequence[str], better: str
) -> tuple[dict[str, float], tuple[str, ...]]:
    """Each mode's mean of `metric` over its trials (yes/no as 1/0), and the modes best
    first (ties in the config's order)."""
    sums: dict[str, list[float]] = {m: [] for m in modes}
    for rec in records:
        v = rec["metrics"].get(metric)
        if rec["mode"] in sums and isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v)):
            sums[rec["mode"]].append(float(v))
    scores = {m: (sum(v) / len(v) if v else math.nan) for m, v in sums.items()}
    sign = -1.0 if better == "higher" else 1.0
    order = sorted(modes, key=lambda m: (math.isnan(scores[m]), sign * scores[m], modes.index(m)))
    return scores, tuple(order)


def _tau(a: Mapping[str, float], b: Mapping[str, float], modes: Sequence[str]) -> float:
    x = [a[m] for m in modes]
    y = [b[m] for m in modes]
    if any(math.isnan(v) for v in (*x, *y)) or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan
    return float(_sps.kendalltau(x, y).statistic)


def _check(config: ExperimentConfig, path: Path) -> None:
    if config.agent.kind != "llm-like":
        raise SensitivityError(
            f"{path}: agent.kind is {config.agent.kind!r}; sensitivity varies the llm-like "
            "agent's weights, so the config needs `agent: {kind: llm-like, ...}`"
        )
    kinds = sorted({spec.agent.kind for spec in plan(config, 1)})
    if kinds != ["llm-like"]:
        raise SensitivityError(
            f"{path}: a grid cell runs agent kind(s) {kinds}; every cell must run llm-like"
        )
    main = main_table(config)
    spec = next(s for s in table_specs(config) if s.name == main)
    baseline = baseline_of(config)
    if spec.rows != "mode" or baseline is None or len(config.modes) < 2:
        raise SensitivityError(
            f"{path}: the main table {main!r} compares no modes against a baseline: its rows "
            "must be modes (report.tables rows: mode), and the config must run the baseline "
            "(report.baseline, else tx-full) and at least one other mode"
        )


def run_sensitivity(
    path: str | Path,
    *,
    designs: int | None = None,
    quick: bool = False,
    jobs: int = 1,
    overrides: Mapping[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
) -> SensitivityResult:
    """Run the config at `path` under every design (`design_points`) and compare each
    design's verdicts and ranking with the default's.

    `designs`: random points (default DEFAULT_DESIGNS, QUICK_DESIGNS with `quick`), from 0 to
    MAX_DESIGNS. `quick`: also only the first third of each cell's trials (at least one).
    `overrides`: dotted keys set on the config first (as `--set`). Raises ConfigError for a
    bad config, SensitivityError for a config this cannot analyse or a bad `designs`.
    Deterministic: the same arguments give the same result, apart from the wall times.
    """
    path = Path(path)
    if designs is None:
        designs = QUICK_DESIGNS if quick else DEFAULT_DESIGNS
    if isinstance(designs, bool) or not isinstance(designs, int) or not 0 <= designs <= MAX_DESIGNS:
        raise SensitivityError(
            f"designs: must be an integer from 0 to {MAX_DESIGNS} (random design points "
            f"besides the one-at-a-time ones), got {designs!r}"
        )
    base = dict(overrides or {})
    config = load_config(path, overrides=base)
    _check(config, path)
    points, fixed = design_points(config.agent, designs, config.seed)
    limit = max(1, math.ceil(config.trials / 3)) if quick else None
    started = time.perf_counter()
    results: list[DesignResult] = []
    reference: VerdictBlock | None = None
    engine = open_executor("local", ExecutorOptions(jobs=jobs))
    try:
        for number, point in enumerate(points):
            t0 = time.perf_counter()
            cfg = load_config(path, overrides={**base, **{f"agent.{k}": v for k, v in point.weights.items()}})
            specs = plan(cfg, limit)
            records = list(engine.results(specs))
            # Records come back in any order with several workers; the analysis must not care.
            records.sort(key=lambda r: (str(r["cell_id"]), int(r["trial"]), str(r["mode"])))
            block = verdict_block(records, cfg)
            if block is None:
                raise SensitivityError(
                    f"{path}: the main table ({cfg.report.main or 'the first table'}) compares no "
                    "modes against a baseline (its rows must be modes, and the config must run "
                    "the baseline, `report.baseline` or tx-full, and another mode)"
                )
            modes = list(block.comparison.modes)
            scores, ranking = _ranking(records, block.comparison.metric, modes, block.better)
            if reference is None:
                reference = block
                tau = 1.0 if len(set(scores.values())) > 1 else math.nan
                matches = len(block.verdicts)
            else:
                tau = _tau(results[0].scores, scores, modes)
                matches = sum(a == b for a, b in zip(reference.verdicts, block.verdicts, strict=True))
            trials = len({spec.trial for spec in specs})
            results.append(DesignResult(point, block.verdicts, matches, scores, ranking, tau, trials,
                                        time.perf_counter() - t0))
            if say:
                say(f"design {number + 1}/{len(points)} {point.name}: {matches}/{len(block.verdicts)} "
                    f"verdicts as the default's, {len(specs)} trials in {time.perf_counter() - t0:.1f} s")
    finally:
        engine.close()
    assert reference is not None
    rows = []
    for i, row in enumerate(reference.comparison.rows):
        default = reference.verdicts[i]
        changed = tuple(f"{d.design.name}: {d.verdicts[i]}" for d in results[1:] if d.verdicts[i] != default)
        rows.append(VerdictStability(row.cell, row.mode, default, row.diff,
                                     len(results) - 1 - len(changed), len(results) - 1, changed))
    return SensitivityResult(
        config=config.name or path.stem,
        path=str(path),
        metric=reference.comparison.metric,
        better=reference.better,
        baseline=reference.comparison.baseline,
        table=reference.table,
        trials=results[0].trials,
        quick=quick,
        kind=reference.comparison.kind,
        designs=results,
        rows=rows,
        fixed=fixed,
        wall_s=time.perf_counter() - started,
        alpha=reference.alpha,
    )


# --------------------------------------------------------------------------- renderers


def _pct(v: float) -> str:
    if math.isnan(v):
        return _NA
    # One decimal unless whole, so that 21.98 of 22 does not read as 100%.
    return f"{100 * v:.0f}%" if round(100 * v, 1) == round(100 * v) else f"{100 * v:.1f}%"


def _tau_text(v: float) -> str:
    return _NA if math.isnan(v) else f"{v:+.2f}"


def _diff_text(v: float, binary: bool) -> str:
    if math.isnan(v):
        return _NA
    return f"{100 * v:+.1f} pp" if binary else f"{v:+.3g}"


def summary_line(result: SensitivityResult) -> str:
    """One sentence: overall stability, designs where every verdict held, tau, time."""
    mean_tau, min_tau = result.tau_summary()
    directional = sum(r.default in ("better", "worse") for r in result.rows)
    return (
        f"{result.config}: {len(result.rows)} verdicts ({result.metric}, each mode against "
        f"{result.baseline}, per cell; {directional} of them better or worse under the default "
        f"weights, the rest no evidence or not exercised) over {len(result.others)} designs "
        "besides the default; "
        f"mean stability {_pct(result.overall)}; designs in which all {len(result.rows)} verdicts "
        f"held at once: {result.all_hold} of {len(result.others)}; Kendall tau-b of the mode ranking against the default's: "
        f"mean {_tau_text(mean_tau)}, min {_tau_text(min_tau)}; {result.trials} trials per cell "
        f"and mode{' (--quick)' if result.quick else ''}; {result.wall_s:.1f} s."
    )


def verdict_header() -> list[str]:
    return ["cell", "mode", "default verdict", "default diff", "held", "stability", "changed in"]


def verdict_rows(result: SensitivityResult) -> list[list[str]]:
    binary = result.kind == "binary"
    out = []
    for r in result.rows:
        changed = "; ".join(r.changed_in) if r.changed_in else ""
        out.append([r.cell, r.mode, r.default, _diff_text(r.diff, binary) if r.exercised else "",
                    f"{r.held}/{r.designs}" if r.exercised else "", _pct(r.stability), changed])
    return out


def design_header() -> list[str]:
    return ["design", *WEIGHT_KEYS, "verdicts as default", "ranking (best first)", "tau-b", "s"]


def design_rows(result: SensitivityResult) -> list[list[str]]:
    n = len(result.rows)
    out = []
    for d in result.designs:
        out.append([d.design.name, *(f"{d.design.weights[k]:.3g}" for k in WEIGHT_KEYS),
                    f"{d.matches}/{n}", " > ".join(d.ranking), _tau_text(d.tau), f"{d.wall_s:.1f}"])
    return out


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def esc(s: str) -> str:
        return s.replace("|", r"\|")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return lines


def sensitivity_markdown(result: SensitivityResult, level: int = 2) -> str:
    """A Markdown section (heading at `level`) for a reproduction report: what was varied,
    the stability of every verdict, and the designs."""
    h = "#" * level
    fixed = (f" Not varied (default 0, so 50% and 150% of it are 0 too): {', '.join(result.fixed)}."
             if result.fixed else "")
    lines = [
        f"{h} Sensitivity of the {result.config} verdicts to the agent's weights",
        "",
        f"The llm-like agent's weights are assumptions. `atomix sensitivity {result.path}"
        f"{' --quick' if result.quick else ''}` re-ran the config on the same cells, seeds and "
        f"trials under {len(result.others)} other weight designs: each weight at "
        f"{LOW:g}x and {HIGH:g}x its default one at a time, and random points with every weight "
        f"uniform in [{LOW:g}w, {HIGH:g}w] (reaction weights rescaled to their default total)."
        f"{fixed} A verdict is the paired comparison of a mode against {result.baseline} in one "
        f"cell of the `{result.table}` table ({result.metric}, {result.better} is better; exact "
        f"McNemar or Wilcoxon, Holm-adjusted, alpha = {result.alpha:g}); its stability is the "
        "share of the other designs in which it reads the same as with the default weights.",
        "",
        summary_line(result),
        "",
        *_md_table(verdict_header(), verdict_rows(result)),
        "",
        f"{h}# Designs",
        "",
        *_md_table(design_header(), design_rows(result)),
        "",
    ]
    return "\n".join(lines)


def _num(v: float) -> str:
    return "" if math.isnan(v) else repr(v)


def sensitivity_csv(result: SensitivityResult) -> str:
    """One line per verdict: cell, mode, the default's verdict and difference, held, designs,
    stability (empty when not exercised), and the designs where it changed."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["config", "metric", "better", "baseline", "cell_id", "mode", "default_verdict",
                "default_diff", "held", "designs", "stability", "changed_in"])
    for r in result.rows:
        w.writerow([result.config, result.metric, result.better, result.baseline, r.cell, r.mode,
                    r.default, _num(r.diff), r.held, r.designs, _num(r.stability),
                    "; ".join(r.changed_in)])
    return buf.getvalue()


def designs_csv(result: SensitivityResult) -> str:
    """One line per design: its weights, verdicts as the default's, ranking, tau-b, seconds."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["design", "kind", *WEIGHT_KEYS, "matches", "verdicts", "ranking", "kendall_tau_b",
                "trials", "wall_s"])
    for d in result.designs:
        w.writerow([d.design.name, d.design.kind, *(repr(d.design.weights[k]) for k in WEIGHT_KEYS),
                    d.matches, len(result.rows), " > ".join(d.ranking), _num(d.tau), d.trials,
                    f"{d.wall_s:.3f}"])
    return buf.getvalue()


def write_sensitivity(result: SensitivityResult, out: Path) -> list[Path]:
    """Write `<config>-sensitivity.csv`, `<config>-designs.csv` and `<config>-sensitivity.md`
    under `out` (created); return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        out / f"{result.config}-sensitivity.csv": sensitivity_csv(result),
        out / f"{result.config}-designs.csv": designs_csv(result),
        out / f"{result.config}-sensitivity.md": sensitivity_markdown(result),
    }
    for target, text in files.items():
        target.write_text(text, encoding="utf-8")
    return list(files)
