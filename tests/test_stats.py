"""Tests for harness.analysis.stats: exact intervals, pair tests, t intervals."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.analysis.stats import (
    INTERVAL_METHODS,
    PairTest,
    Proportion,
    clopper_pearson,
    compare_proportions,
    format_pct,
    interval,
    mean_ci,
    poisson_interval,
    wilson,
)

# (k, n) -> (lo %, hi %) to one decimal, from the brief / paper Tables 2 and 6.
KNOWN_CP = {
    (0, 500): (0.0, 0.7351),
    (400, 500): (76.2, 83.4),
    (22, 30): (54.1, 87.7),
    (6, 10): (26.2, 87.8),
}


@pytest.mark.parametrize(("k", "n"), sorted(KNOWN_CP))
def test_clopper_pearson_known_values(k: int, n: int) -> None:
    p = clopper_pearson(k, n)
    lo, hi = KNOWN_CP[(k, n)]
    assert 100 * p.lo == pytest.approx(lo, abs=0.05)
    assert 100 * p.hi == pytest.approx(hi, abs=0.05)
    assert (p.successes, p.n, p.method, p.confidence) == (k, n, "clopper-pearson", 0.95)
    assert p.rate == k / n


def test_clopper_pearson_zero_upper_bound_precise() -> None:
    # 0/500: hi = 1 - 0.025**(1/500) exactly (beta(1, n) quantile).
    assert clopper_pearson(0, 500).hi == pytest.approx(1 - 0.025 ** (1 / 500), rel=1e-9)


def test_clopper_pearson_edges_exact() -> None:
    assert clopper_pearson(0, 17).lo == 0.0
    assert clopper_pearson(17, 17).hi == 1.0
    assert clopper_pearson(17, 17).lo == pytest.approx(0.025 ** (1 / 17))


@pytest.mark.parametrize("fn", [clopper_pearson, wilson])
def test_empty_cell_is_reportable(fn) -> None:
    p = fn(0, 0)
    assert math.isnan(p.rate)
    assert (p.lo, p.hi, p.n) == (0.0, 1.0, 0)
    assert p.pct() == "n/a"


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (22, 30), (250, 500), (499, 500)])
def test_clopper_pearson_symmetry(k: int, n: int) -> None:
    a, b = clopper_pearson(k, n), clopper_pearson(n - k, n)
    assert a.lo == pytest.approx(1 - b.hi, abs=1e-12)
    assert a.hi == pytest.approx(1 - b.lo, abs=1e-12)


@st.composite
def counts(draw) -> tuple[int, int]:
    n = draw(st.integers(min_value=1, max_value=2000))
    k = draw(st.integers(min_value=0, max_value=n))
    return k, n


@given(
    counts(),
    st.sampled_from(sorted(INTERVAL_METHODS)),
    st.sampled_from([0.8, 0.9, 0.95, 0.99]),
)
def test_interval_contains_rate_and_is_within_unit(kn, method: str, conf: float) -> None:
    k, n = kn
    p = interval(k, n, method, conf)
    assert 0.0 <= p.lo <= k / n <= p.hi <= 1.0
    assert p.method == method


@given(counts())
def test_higher_confidence_is_wider(kn) -> None:
    k, n = kn
    narrow, wide = clopper_pearson(k, n, 0.9), clopper_pearson(k, n, 0.99)
    assert wide.lo <= narrow.lo and narrow.hi <= wide.hi


def test_wilson_known_value_matches_hand_formula() -> None:
    k, n, z = 22, 30, 1.959963984540054
    p = k / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z / (1 + z**2 / n) * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    w = wilson(k, n)
    assert w.lo == pytest.approx(centre - half, rel=1e-9)
    assert w.hi == pytest.approx(centre + half, rel=1e-9)
    assert (100 * w.lo, 100 * w.hi) == pytest.approx((55.6, 85.8), abs=0.05)
    # Wilson is narrower than the exact interval here.
    cp = clopper_pearson(k, n)
    assert cp.lo < w.lo and w.hi < cp.hi


def test_wilson_edges_pinned() -> None:
    assert wilson(0, 50).lo == 0.0
    assert wilson(50, 50).hi == 1.0


def test_interval_dispatch_and_unknown_method() -> None:
    assert interval(22, 30) == clopper_pearson(22, 30)
    assert interval(22, 30, "wilson") == wilson(22, 30)
    with pytest.raises(ValueError, match="clopper-pearson, wilson"):
        interval(1, 2, "wald")


@pytest.mark.parametrize(("k", "n"), [(-1, 5), (6, 5), (0, -1)])
def test_bad_counts_name_the_values(k: int, n: int) -> None:
    with pytest.raises(ValueError, match=rf"k={k}, n={n}"):
        clopper_pearson(k, n)
    with pytest.raises(ValueError, match=rf"k={k}, n={n}"):
        wilson(k, n)


def test_non_integer_counts_and_bad_confidence() -> None:
    with pytest.raises(TypeError):
        clopper_pearson(2.5, 10)  # type: ignore[arg-type]
    for conf in (0.0, 1.0, 95):
        with pytest.raises(ValueError, match="confidence"):
            clopper_pearson(1, 10, conf)


def test_pct_formatting_is_honest() -> None:
    assert clopper_pearson(0, 500).pct() == "0 [0, 0.7]"
    assert clopper_pearson(0, 500).pct(edge_decimals=2) == "0 [0, 0.74]"  # paper Table 2
    assert clopper_pearson(500, 500).pct() == "100 [99.3, 100]"
    assert clopper_pearson(400, 500).pct() == "80 [76, 83]"
    assert clopper_pearson(22, 30).pct() == "73 [54, 88]"
    assert clopper_pearson(6, 10).fraction() == "6/10"
    # A tiny non-zero bound is never printed as 0.
    assert format_pct(0.004) == "0.004"
    assert format_pct(99.9996) == "99.9996"
    assert format_pct(0.0) == "0" and format_pct(100.0) == "100"
    assert format_pct(math.nan) == "n/a"


def test_proportion_is_frozen() -> None:
    p = Proportion(1, 2, 0.0, 1.0, "x")
    with pytest.raises(AttributeError):
        p.n = 3  # type: ignore[misc]


def test_fisher_known_table() -> None:
    # Table [[8, 2], [1, 5]]: 8/10 vs 1/6.
    r = compare_proportions(8, 10, 1, 6)
    assert isinstance(r, PairTest)
    assert r.test == "fisher"
    assert r.p_value == pytest.approx(0.034965, abs=1e-5)
    assert (r.a, r.b) == ((8, 10), (1, 6))


def test_boschloo_more_powerful_on_known_table() -> None:
    fisher = compare_proportions(8, 10, 1, 6, test="fisher").p_value
    boschloo = compare_proportions(8, 10, 1, 6, test="boschloo").p_value
    assert 0.0 < boschloo < fisher


def test_pair_tests_symmetric_in_samples() -> None:
    for test in ("fisher", "boschloo"):
        ab = compare_proportions(8, 10, 1, 6, test=test).p_value
        ba = compare_proportions(1, 6, 8, 10, test=test).p_value
        assert ab == pytest.approx(ba, rel=1e-9)


@pytest.mark.parametrize("test", ["fisher", "boschloo"])
@pytest.mark.parametrize(
    "args", [(0, 0, 3, 5), (3, 5, 0, 0), (0, 0, 0, 0), (0, 5, 0, 7), (5, 5, 7, 7)]
)
def test_degenerate_tables_give_p_one(test: str, args: tuple[int, int, int, int]) -> None:
    assert compare_proportions(*args, test=test).p_value == 1.0


def test_compare_errors() -> None:
    with pytest.raises(ValueError, match="boschloo, fisher"):
        compare_proportions(1, 2, 1, 2, test="chi2")
    with pytest.raises(ValueError, match="k=3, n=2"):
        compare_proportions(3, 2, 1, 2)


def test_mean_ci_known_value() -> None:
    m, lo, hi = mean_ci([1, 2, 3, 4, 5])
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)
    assert m == 3.0
    assert (lo, hi) == pytest.approx((3 - half, 3 + half), rel=1e-12)


def test_mean_ci_edge_cases() -> None:
    assert mean_ci([12.5]) == (12.5, 12.5, 12.5)
    assert all(math.isnan(x) for x in mean_ci([]))
    assert mean_ci([4.0, 4.0, 4.0]) == (4.0, 4.0, 4.0)
    with pytest.raises(ValueError, match="finite"):
        mean_ci([1.0, math.nan])


def test_poisson_interval() -> None:
    lo, hi = poisson_interval(0)
    # Zero events: the upper bound is -ln(alpha/2) exactly.
    assert lo == 0.0
    assert hi == pytest.approx(-math.log(0.025), rel=1e-12)
    lo, hi = poisson_interval(10)
    assert (lo, hi) == pytest.approx((4.7954, 18.3904), abs=1e-3)
    with pytest.raises(ValueError):
        poisson_interval(-1)
