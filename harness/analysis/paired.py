"""Paired comparison of modes: every mode against a baseline on matched trials.

Modes of one run share tasks, seeds and fault draws: trial ``t`` of cell ``c`` sees the same
scenario under every mode (harness/experiment/trial.py derives everything from (seed, cell,
trial)), and with Bernoulli arrival the same fault draws: a delivery's fault depends only on
the trial seed and its key (agent, point, role, site, occurrence), so two modes whose agent
makes the same logical call for the k-th time meet the same fault there, whatever the mode and
whatever order the calls came in (harness/world/faults.py). Where two modes' calls differ
(one retried a step or sent a call the other did not), those calls get their own draws; with
bursty arrival the chain runs in the order asked and pairs only the scenario. Trials are
therefore *paired*, and the right tests are paired:

* a yes/no metric: the exact McNemar test (a two-sided binomial test on the discordant
  pairs, scipy's ``binomtest``) and Newcombe's hybrid score interval for the difference of
  paired proportions (Newcombe 1998, "Improved confidence intervals for the difference
  between binomial proportions based on paired data", Stat. Med. 17:2635-2650, method 10;
  as given in Altman et al., *Statistics with Confidence*, 2nd ed., 2000, ch. 6), built
  from scipy's Wilson intervals of the two marginal rates;
* a count or other numeric metric: the Wilcoxon signed-rank test on the paired
  differences (scipy) and a Student t interval on the mean difference.

Every p-value printed in one comparison is adjusted together by Holm's step-down method
(Holm 1979), which controls the family-wise error rate without assuming independence.

A pair is matched on ``(cell_id, seed, trial)``; a trial present under one mode only, or
with the metric missing, is left out and counted as unmatched. A (cell, mode) whose trials
did not exercise what the comparison requires (``harness.analysis.exercised.is_exercised``) is shown
but not tested.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scipy import stats as _sps

from harness.analysis.runs import exercised_by_cell
from harness.analysis.stats import format_pct, mean_ci
from harness.analysis.table import NOT_EXERCISED_TEXT
from harness.registry import did_you_mean

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FORMATS",
    "PairRow",
    "PairedComparison",
    "holm",
    "mcnemar_exact",
    "newcombe_paired",
    "paired_compare",
    "verdict",
]

FORMATS: tuple[str, ...] = ("md", "csv", "tex")
BINARY_TEST = "exact McNemar"
COUNT_TEST = "Wilcoxon signed-rank"
BINARY_INTERVAL = "Newcombe hybrid score (paired)"
COUNT_INTERVAL = "t on the mean paired difference"


# --------------------------------------------------------------------------- statistics


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value for discordant counts ``gained`` and ``lost``.

    Conditional on the b + c discordant pairs, b ~ Binomial(b + c, 1/2) under no
    difference; no discordant pair carries no evidence and gives 1.0.
    """
    if gained < 0 or lost < 0:
        raise ValueError(f"discordant counts must be >= 0, got {gained}, {lost}")
    if gained + lost == 0:
        return 1.0
    return float(_sps.binomtest(gained, gained + lost, 0.5, alternative="two-sided").pvalue)


def _wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    ci = _sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def newcombe_paired(
    both: int, gained: int, lost: int, neither: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(difference, lo, hi) for p_mode - p_baseline from a paired 2x2 table.

    ``both``: both succeeded; ``gained``: the mode succeeded where the baseline failed;
    ``lost``: the reverse; ``neither``: both failed. Newcombe's method 10 (hybrid score,
    with his continuity-corrected correlation phi). Guarantees -1 <= lo <= diff <= hi <= 1;
    an empty table gives three nans.
    """
    cells = (both, gained, lost, neither)
    if any(c < 0 for c in cells):
        raise ValueError(f"counts must be >= 0, got {cells}")
    n = sum(cells)
    if n == 0:
        return math.nan, math.nan, math.nan
    k1, k2 = both + gained, both + lost  # mode's and baseline's successes
    p1, p2 = k1 / n, k2 / n
    l1, u1 = _wilson(k1, n, confidence)
    l2, u2 = _wilson(k2, n, confidence)
    margins = (k1, n - k1, k2, n - k2)
    phi = 0.0
    if all(margins):
        a = both * neither - gained * lost
        # Newcombe's correction: a positive association is shrunk by n/2, a small one is 0.
        num = a - n / 2 if a > n / 2 else (a if a < 0 else 0.0)
        phi = num / math.sqrt(math.prod(margins))
    d = p1 - p2
    lo = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return d, max(-1.0, min(lo, d)), min(1.0, max(hi, d))


def wilcoxon_paired(diffs: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value for paired differences (zero differences
    dropped, scipy's default); no non-zero difference gives 1.0."""
    if not any(d != 0 for d in diffs):
        return 1.0
    return float(_sps.wilcoxon(list(diffs), alternative="two-sided").pvalue)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in input order; nan stays nan and is not counted.

    Guarantees: adjusted >= raw, adjusted <= 1, and the order of the raw p-values is kept.
    """
    indexed = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(indexed)
    out = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))  # monotone: never below a smaller p
        out[i] = running
    return out


# --------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class PairRow:
    """One mode against the baseline in one cell, on its matched trials.

    For a yes/no metric ``base``/``value`` are success rates (fractions) and ``gained`` /
    ``lost`` the discordant pairs; for a numeric metric they are means and gained / lost
    count pairs where the mode was higher / lower. ``diff``, ``lo``, ``hi`` are value -
    base with its interval; ``p`` is raw, ``p_holm`` adjusted over the whole comparison
    (both nan when not tested).
    """

    cell: str
    mode: str
    pairs: int
    base: float
    value: float
    base_total: float
    total: float
    gained: int
    lost: int
    diff: float
    lo: float
    hi: float
    p: float
    p_holm: float
    exercised: bool
    unmatched: int


@dataclass
class PairedComparison:
    """Every mode against ``baseline`` per cell on one metric (see module docstring)."""

    metric: str
    kind: str  # "binary" | "numeric"
    baseline: str
    modes: list[str]  # the baseline first
    cells: list[str]
    rows: list[PairRow]
    confidence: float = 0.95
    requires: str | None = None
    explicit_modes: bool = False

    @property
    def test(self) -> str:
        return BINARY_TEST if self.kind == "binary" else COUNT_TEST

    @property
    def interval_method(self) -> str:
        return BINARY_INTERVAL if self.kind == "binary" else COUNT_INTERVAL

    @property
    def title(self) -> str:
        return f"{self.metric}: each mode against {self.baseline} on paired trials"

    @property
    def footer(self) -> str:
        conf = f"{100 * self.confidence:g}%"
        if self.kind == "binary":
            what = (
                f"percent {self.metric}; +/- = pairs the mode won/lost against {self.baseline}; "
                f"difference in percentage points with {conf} {BINARY_INTERVAL} interval "
                "(Newcombe 1998)"
            )
        else:
            what = (
                f"mean {self.metric}; +/- = pairs where the mode was higher/lower; "
                f"mean paired difference with {conf} t interval"
            )
        n_tests = sum(1 for r in self.rows if not math.isnan(r.p))
        text = (
            f"Pairs matched on (cell, seed, trial); {what}; p: two-sided {self.test} test, "
            f"Holm-adjusted over the {n_tests} tests shown."
        )
        unmatched = sum(r.unmatched for r in self.rows)
        if unmatched:
            text += f" {unmatched} trial(s) without a partner were left out."
        if not all(r.exercised for r in self.rows):
            text += f" {NOT_EXERCISED_TEXT}: the cell's condition did not occur; not tested."
        return text

    def header(self) -> list[str]:
        unit = "%" if self.kind == "binary" else "mean"
        diff = "diff (pp)" if self.kind == "binary" else "diff"
        conf = f"{100 * self.confidence:g}% CI"
        return [
            "cell", "mode", "pairs", f"{self.baseline} {unit}", f"mode {unit}",
            "+/-", diff, conf, "p", "p Holm",
        ]  # fmt: skip

    def display_rows(self) -> list[list[str]]:
        """Text cells in ``header()`` order."""
        out = []
        for r in self.rows:
            if not r.exercised:
                rest = [NOT_EXERCISED_TEXT, "", "", "", "", "", ""]
                out.append([r.cell, r.mode, str(r.pairs), *rest])
                continue
            out.append(
                [
                    r.cell,
                    r.mode,
                    str(r.pairs),
                    self._fmt_level(r.base),
                    self._fmt_level(r.value),
                    f"+{r.gained}/-{r.lost}",
                    self._fmt_diff(r.diff),
                    f"[{self._fmt_diff(r.lo)}, {self._fmt_diff(r.hi)}]",
                    format_p(r.p),
                    format_p(r.p_holm),
                ]
            )
        return out

    def _fmt_level(self, v: float) -> str:
        if math.isnan(v):
            return "n/a"
        return format_pct(100 * v) if self.kind == "binary" else _fmt_num(v)

    def _fmt_diff(self, v: float) -> str:
        if math.isnan(v):
            return "n/a"
        if self.kind == "binary":
            v = 100 * v
            text = f"{v:+.0f}" if round(v) == v or abs(v) >= 1 else f"{v:+.1f}"
            return "0" if text in ("+0", "-0") else text
        return _fmt_num(v, signed=True)


VERDICTS: tuple[str, ...] = ("better", "worse", "no evidence")


def verdict(row: PairRow, *, better: str = "higher", alpha: float = 0.05) -> str:
    """The plain reading of one paired row: is the mode `better` or `worse` than the baseline,
    or is there `no evidence` either way at level `alpha` (on the Holm-adjusted p)?

    `better` says which direction of the metric is good ("higher" for success rates,
    "lower" for residue, waits, violations). A row whose cell did not exercise its condition
    reads as not exercised, never as a verdict.
    """
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if not row.exercised or math.isnan(row.p_holm):
        return NOT_EXERCISED_TEXT
    if row.p_holm >= alpha or row.diff == 0 or math.isnan(row.diff):
        return "no evidence"
    up = row.diff > 0
    return "better" if up == (better == "higher") else "worse"


def _fmt_num(v: float, signed: bool = False) -> str:
    d = 2 if abs(v) < 10 else 1
    text = f"{v:+.{d}f}" if signed else f"{v:.{d}f}"
    return text.replace("-0.00", "0.00").replace("+0.00", "0.00")


def format_p(p: float) -> str:
    """p as text: 3 decimals, scientific below 0.001, ``n/a`` when not tested."""
    if math.isnan(p):
        return "n/a"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _metric_kind(values: Iterable[Any], metric: str) -> str:
    """ "binary" when every value is a yes/no, "numeric" when every value is a number;
    anything else is refused, naming the metric and the offending value."""
    values = list(values)
    if all(isinstance(v, bool) for v in values):
        return "binary"
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(
                f"metric {metric!r} mixes or holds non-numeric values (e.g. {v!r}); "
                "compare tests yes/no metrics (exact McNemar) and numeric ones (Wilcoxon "
                "signed-rank), nothing else"
            )
    # 0/1 integers are counts unless the metric is declared a proportion; counts of 0 or 1
    # in a small run must not silently switch tests, so ints are always numeric here.
    return "numeric"


def paired_compare(
    records: Sequence[Mapping[str, Any]],
    metric: str,
    modes: Sequence[str],
    baseline: str | None = None,
    cell_order: Sequence[str] = (),
    confidence: float = 0.95,
    requires: str | None = None,
    explicit_modes: bool = False,
    frame: pd.DataFrame | None = None,
) -> PairedComparison:
    """Compare every mode of ``modes`` against ``baseline`` (default: the first) per cell.

    Raises ValueError naming the problem: fewer than two modes, a repeated mode, a mode or
    metric with no records, or a metric that is neither yes/no nor numeric. A yes/no metric
    (every value a bool) gets the exact McNemar test and Newcombe's paired interval; a
    numeric metric (counts, times) the Wilcoxon signed-rank test and a t interval on the
    mean difference. Cells follow ``cell_order``, then any others sorted. ``frame``:
    ``records_frame(records)`` where the caller has it (what the cells exercised is read
    from it instead of a frame built here).
    """
    modes = list(modes)
    if len(set(modes)) != len(modes):
        raise ValueError(f"a mode is listed twice in {modes}")
    baseline = baseline or (modes[0] if modes else None)
    if baseline is None:
        raise ValueError("compare needs at least two modes")
    if baseline not in modes:
        modes = [baseline, *modes]
    modes = [baseline, *(m for m in modes if m != baseline)]
    if len(modes) < 2:
        raise ValueError(f"compare needs a mode besides the baseline {baseline!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    present = sorted({str(r["mode"]) for r in records})
    missing = [m for m in modes if m not in present]
    if missing:
        raise ValueError(
            f"mode(s) {missing} have no trials in this run{did_you_mean(missing[0], present)}; "
            f"it has: {present}"
        )
    metrics = sorted(set().union(*(r.get("metrics", {}) for r in records)))
    if metric not in metrics:
        raise ValueError(
            f"unknown metric {metric!r}{did_you_mean(metric, metrics)}; "
            f"the records have: {', '.join(metrics)}"
        )

    # (cell, mode) -> {(seed, trial): value}
    by_cell: dict[tuple[str, str], dict[tuple[Any, Any], Any]] = {}
    values: list[Any] = []
    for rec in records:
        mode = str(rec["mode"])
        if mode not in modes:
            continue
        v = rec["metrics"].get(metric)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        values.append(v)
        key = (rec.get("seed"), rec.get("trial"))
        slot = by_cell.setdefault((str(rec["cell_id"]), mode), {})
        if key in slot:
            raise ValueError(
                f"two {mode} trials in cell {rec['cell_id']} share seed and trial {key}: "
                "pairs would be ambiguous"
            )
        slot[key] = v
    kind = _metric_kind(values, metric)

    present_cells = {c for c, _ in by_cell}
    head = [c for c in dict.fromkeys(cell_order) if c in present_cells]
    cells = head + sorted(present_cells - set(head))
    exercised = exercised_by_cell(records, modes, requires, frame)

    raw: list[dict[str, Any]] = []
    for cell in cells:
        base = by_cell.get((cell, baseline), {})
        for mode in modes[1:]:
            other = by_cell.get((cell, mode), {})
            keys = sorted(set(base) & set(other), key=lambda k: (str(k[0]), str(k[1])))
            unmatched = len(set(base) ^ set(other))
            ok = exercised.get((cell, baseline), True) and exercised.get((cell, mode), True)
            raw.append(
                dict(
                    cell=cell,
                    mode=mode,
                    unmatched=unmatched,
                    exercised=ok,
                    **_pair_stats(
                        [base[k] for k in keys], [other[k] for k in keys], kind, confidence, ok
                    ),
                )
            )
    adjusted = holm([r["p"] for r in raw])
    rows = [PairRow(**r, p_holm=a) for r, a in zip(raw, adjusted, strict=True)]
    return PairedComparison(
        metric, kind, baseline, modes, cells, rows, confidence, requires, explicit_modes
    )


def _pair_stats(
    base: list[Any], other: list[Any], kind: str, confidence: float, test: bool
) -> dict[str, Any]:
    n = len(base)
    nan = math.nan
    if kind == "binary":
        b = [bool(v) for v in base]
        o = [bool(v) for v in other]
        both = sum(x and y for x, y in zip(b, o, strict=True))
        gained = sum(y and not x for x, y in zip(b, o, strict=True))
        lost = sum(x and not y for x, y in zip(b, o, strict=True))
        neither = n - both - gained - lost
        d, lo, hi = newcombe_paired(both, gained, lost, neither, confidence)
        p = mcnemar_exact(gained, lost) if test and n else nan
        return dict(
            pairs=n,
            base=sum(b) / n if n else nan,
            value=sum(o) / n if n else nan,
            base_total=sum(b),
            total=sum(o),
            gained=gained,
            lost=lost,
            diff=d,
            lo=lo,
            hi=hi,
            p=p,
        )
    bx = [float(v) for v in base]
    ox = [float(v) for v in other]
    diffs = [y - x for x, y in zip(bx, ox, strict=True)]
    d, lo, hi = mean_ci(diffs, confidence) if n else (nan, nan, nan)
    return dict(
        pairs=n,
        base=math.fsum(bx) / n if n else nan,
        value=math.fsum(ox) / n if n else nan,
        base_total=math.fsum(bx),
        total=math.fsum(ox),
        gained=sum(1 for x in diffs if x > 0),
        lost=sum(1 for x in diffs if x < 0),
        diff=d,
        lo=lo,
        hi=hi,
        p=wilcoxon_paired(diffs) if test and n else nan,
    )
