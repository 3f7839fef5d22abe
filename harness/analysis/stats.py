"""Proportions with exact intervals, two-sample tests and t intervals (cut at a metric's
range) for the harness.

Proportions are reported with exact two-sided 95% Clopper–Pearson intervals (scipy; see
docs/design.md, "Measuring"). Everything here is a pure function of its arguments: no
randomness, no I/O.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scipy import stats as _sps

__all__ = [
    "INTERVAL_METHODS",
    "METHOD_LABELS",
    "PAIR_TESTS",
    "PairTest",
    "Proportion",
    "clopper_pearson",
    "compare_proportions",
    "format_pct",
    "interval",
    "mean_ci",
    "poisson_interval",
    "wilson",
]


def format_pct(value: float, decimals: int = 0, edge_decimals: int = 1) -> str:
    """Format a percentage so that it never reads as 0 or 100 unless it is exactly that.

    ``decimals`` applies in general; inside (0, 1) and (99, 100) at least ``edge_decimals``
    are used, and more if the rounded text would still say 0 or 100 (e.g. 0.004 -> "0.004").
    """
    if math.isnan(value):
        return "n/a"
    if value in (0.0, 100.0):
        return f"{value:.{decimals}f}"
    d = decimals
    if 0.0 < value < 1.0 or 99.0 < value < 100.0:
        d = max(d, edge_decimals)
    text = f"{value:.{d}f}"
    # An interval bound of 0.003% printed as "0.0" would claim certainty we do not have.
    while float(text) in (0.0, 100.0) and d < 12:
        d += 1
        text = f"{value:.{d}f}"
    return text


@dataclass(frozen=True)
class Proportion:
    """``successes`` out of ``n`` with a two-sided interval [lo, hi] for the rate.

    Guarantees: 0 <= successes <= n, 0 <= lo <= hi <= 1 (fractions, not percent), and
    lo <= rate <= hi whenever n > 0. An empty cell (n == 0) has rate nan and [0, 1].
    """

    successes: int
    n: int
    lo: float
    hi: float
    method: str
    confidence: float = 0.95

    @property
    def rate(self) -> float:
        """successes / n, or nan for an empty cell."""
        return self.successes / self.n if self.n else math.nan

    def pct_values(self) -> tuple[float, float, float]:
        """(rate, lo, hi) in percent."""
        return 100.0 * self.rate, 100.0 * self.lo, 100.0 * self.hi

    def pct(self, decimals: int = 0, edge_decimals: int = 1) -> str:
        """Paper-style cell text, e.g. ``"73 [54, 88]"`` or ``"0 [0, 0.7]"`` (percent).

        Values are rounded to ``decimals``; a value strictly inside (0, 1) or (99, 100) gets
        ``edge_decimals`` (see :func:`format_pct`), so nothing non-zero reads as 0 or 100.
        """
        if self.n == 0:
            return "n/a"
        r, lo, hi = self.pct_values()
        parts = (format_pct(v, decimals, edge_decimals) for v in (r, lo, hi))
        return "{} [{}, {}]".format(*parts)

    def fraction(self) -> str:
        """``"22/30"``."""
        return f"{self.successes}/{self.n}"


def _check_counts(k: int, n: int) -> tuple[int, int]:
    try:
        k_i, n_i = operator.index(k), operator.index(n)
    except TypeError:
        raise TypeError(f"counts must be integers, got k={k!r}, n={n!r}") from None
    if n_i < 0 or k_i < 0 or k_i > n_i:
        raise ValueError(f"need 0 <= k <= n, got k={k_i}, n={n_i}")
    return k_i, n_i


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Proportion:
    """Exact two-sided Clopper–Pearson interval from beta quantiles.

    lo is exactly 0 when k == 0 and hi exactly 1 when k == n (the beta quantile is
    undefined there). n == 0 gives [0, 1] with rate nan rather than an error, so that an
    empty cell can still be reported.
    """
    k, n = _check_counts(k, n)
    alpha = 1.0 - _check_confidence(confidence)
    if n == 0:
        return Proportion(0, 0, 0.0, 1.0, "clopper-pearson", confidence)
    lo = 0.0 if k == 0 else float(_sps.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(_sps.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return Proportion(k, n, lo, hi, "clopper-pearson", confidence)


def wilson(k: int, n: int, confidence: float = 0.95) -> Proportion:
    """Wilson score interval (not exact; narrower than Clopper–Pearson)."""
    k, n = _check_counts(k, n)
    alpha = 1.0 - _check_confidence(confidence)
    if n == 0:
        return Proportion(0, 0, 0.0, 1.0, "wilson", confidence)
    z = float(_sps.norm.ppf(1 - alpha / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Pin the edges: algebraically exact there, but rounding can leave 1e-17 residue.
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return Proportion(k, n, lo, hi, "wilson", confidence)


INTERVAL_METHODS: dict[str, Callable[[int, int, float], Proportion]] = {
    "clopper-pearson": clopper_pearson,
    "wilson": wilson,
}

#: Human-readable names for footers and captions.
METHOD_LABELS: dict[str, str] = {
    "clopper-pearson": "Clopper–Pearson",
    "wilson": "Wilson",
    "t": "t",
    "poisson-exact": "exact Poisson (Garwood)",
}


def interval(
    k: int, n: int, method: str = "clopper-pearson", confidence: float = 0.95
) -> Proportion:
    """Interval for k/n by registered method name (see ``INTERVAL_METHODS``)."""
    try:
        fn = INTERVAL_METHODS[method]
    except KeyError:
        allowed = ", ".join(sorted(INTERVAL_METHODS))
        raise ValueError(f"unknown interval method {method!r}; allowed: {allowed}") from None
    return fn(k, n, confidence)


def poisson_interval(count: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Garwood) two-sided interval for the mean of a Poisson count.

    Used for per-trial counts that may exceed 1 (e.g. leaks per 1,000 trials), where a
    binomial interval does not apply. count == 0 gives lo == 0.
    """
    try:
        count = operator.index(count)
    except TypeError:
        raise TypeError(f"count must be an integer, got {count!r}") from None
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    alpha = 1.0 - _check_confidence(confidence)
    lo = 0.0 if count == 0 else float(_sps.chi2.ppf(alpha / 2, 2 * count)) / 2
    hi = float(_sps.chi2.ppf(1 - alpha / 2, 2 * count + 2)) / 2
    return lo, hi


@dataclass(frozen=True)
class PairTest:
    """Result of a two-sided exact test of k1/n1 vs k2/n2.

    Guarantees: 0 <= p_value <= 1; ``a`` and ``b`` are the (successes, n) pairs tested.
    """

    test: str
    p_value: float
    a: tuple[int, int]
    b: tuple[int, int]


def _fisher(k1: int, n1: int, k2: int, n2: int) -> float:
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    return float(_sps.fisher_exact(table, alternative="two-sided").pvalue)


def _boschloo(k1: int, n1: int, k2: int, n2: int) -> float:
    # scipy's Boschloo treats each *column* as one binomial sample.
    table = [[k1, k2], [n1 - k1, n2 - k2]]
    return float(_sps.boschloo_exact(table, alternative="two-sided").pvalue)


PAIR_TESTS: dict[str, Callable[[int, int, int, int], float]] = {
    "fisher": _fisher,
    "boschloo": _boschloo,
}


def compare_proportions(k1: int, n1: int, k2: int, n2: int, test: str = "fisher") -> PairTest:
    """Two-sided exact test of equal rates, by registered name (see ``PAIR_TESTS``).

    A degenerate table carries no evidence and gives p = 1.0: an empty sample (n == 0),
    or all trials successes / all failures in both samples (scipy's Boschloo returns nan).
    """
    k1, n1 = _check_counts(k1, n1)
    k2, n2 = _check_counts(k2, n2)
    try:
        fn = PAIR_TESTS[test]
    except KeyError:
        allowed = ", ".join(sorted(PAIR_TESTS))
        raise ValueError(f"unknown test {test!r}; allowed: {allowed}") from None
    total = k1 + k2
    if n1 == 0 or n2 == 0 or total in (0, n1 + n2):
        p = 1.0
    else:
        p = min(1.0, max(0.0, fn(k1, n1, k2, n2)))
    return PairTest(test, p, (k1, n1), (k2, n2))


def mean_ci(
    values: Iterable[float],
    confidence: float = 0.95,
    lower: float | None = None,
    upper: float | None = None,
) -> tuple[float, float, float]:
    """(mean, lo, hi) with a two-sided Student t interval, cut at the metric's range.

    ``lower``/``upper`` are the bounds the metric cannot leave (0 for a count, a wait or a
    residue; 0 and 1 for a share); None: unbounded. The t interval is symmetric, so for a
    skewed non-negative sample (mostly 0, a few large values) it reaches below 0; the part
    outside the range holds no possible mean, so cutting it off keeps the coverage and only
    removes impossible values. Cutting rather than a bootstrap keeps the interval a pure
    function of the values (no seed) and equal to the t interval wherever it fits.
    Guarantees: lower <= lo <= mean <= hi <= upper whenever every value is in the range.
    A value outside the range raises ValueError (the range is declared wrongly).

    One value gives (v, v, v) (no spread to estimate); no values gives three nans.
    Non-finite values raise ValueError: silently dropping them would change N.
    """
    alpha = 1.0 - _check_confidence(confidence)
    xs = [float(v) for v in values]
    if any(not math.isfinite(x) for x in xs):
        raise ValueError("mean_ci: values must be finite (drop missing values first)")
    if lower is not None and upper is not None and lower > upper:
        raise ValueError(f"mean_ci: lower bound {lower} is above upper bound {upper}")
    outside = [
        x for x in xs if (lower is not None and x < lower) or (upper is not None and x > upper)
    ]
    if outside:
        raise ValueError(
            f"mean_ci: value {outside[0]!r} is outside the declared range [{lower}, {upper}]"
        )
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    m = math.fsum(xs) / n
    # fsum's mean of in-range values can round a hair outside the range (e.g. all values 1).
    if lower is not None:
        m = max(m, lower)
    if upper is not None:
        m = min(m, upper)
    if n == 1:
        return m, m, m
    sd = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1))
    half = float(_sps.t.ppf(1 - alpha / 2, n - 1)) * sd / math.sqrt(n)
    lo, hi = min(m - half, m), max(m + half, m)
    if lower is not None:
        lo = max(lo, lower)
    if upper is not None:
        hi = min(hi, upper)
    return m, lo, hi
