"""The benchmark script runs end to end (its figures are not asserted: speed is read, not
tested); each phase checks its own results, so a broken runtime fails here."""

from __future__ import annotations

import pytest

from harness.bench import figures, runtime, scaling
from harness.bench.__main__ import main


def test_quick_benchmark_runs_and_reports_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick"]) == 0
    out = capsys.readouterr().out
    for line in ("(a) shimmed bufferable call", "(b) transaction with 4", "(c) speculation"):
        assert line in out
    for k in (2, 4, 8, 16):
        assert any(row.split()[:1] == [str(k)] for row in out.splitlines())
    assert "K = 16 per branch" in out and "K = 16 target" in out
    assert "(e) hot paths" in out and "reversible call" in out and "fixed commit cost" in out
    assert "machine reference" in out


def test_speculation_bench_checks_that_exactly_the_winner_committed() -> None:
    setup, settle, total = runtime.bench_speculation(4, 20)
    assert setup.n == settle.n == total.n == 20
    assert 0 < setup.median <= total.median


def test_the_suite_prints_every_figure_with_its_target_and_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--suite` in its tiny mode (a few agents, few rounds): every figure of items 1 and 3
    is printed with a target and PASS or MISS (the values are not judged here)."""
    assert main(["--suite", "--tiny"]) == 0
    lines = capsys.readouterr().out.splitlines()
    figures = [line.strip() for line in lines if line.startswith("  ") and ": " in line]
    wanted = [
        "reversible call",
        "fixed commit cost",
        "K = 16 speculation, total, median",
        "K = 16 speculation, total, p99",
        "tx-full, core alone",
        "tx-global-frontier, core alone",
        "tx-full on tau_contention",
        "tx-global-frontier on tau_contention",
    ]
    for name in wanted:
        (row,) = [f for f in figures if name in f]
        assert row.split()[0] in ("PASS", "MISS") and "(target " in row, row
    assert any(line.endswith("s") and "figures" in line for line in lines)


def test_figures_share_one_shape() -> None:
    figure = figures.Figure("x", 1.0, "µs", "<= 2", True)
    assert (figure.name, figure.value, figure.unit, figure.target, figure.met) == (
        "x", 1.0, "µs", "<= 2", True,
    )


def test_the_exponent_fit_recovers_a_power_law() -> None:
    points = [(n, 3.0 * n**1.25) for n in (64, 128, 256, 512, 1024)]
    assert figures.fit_exponent(points) == pytest.approx(1.25)


@pytest.mark.parametrize("frontier", ["per-resource", "global"])
def test_the_core_simulation_settles_every_agent(frontier: str) -> None:
    """The harness-free contention run drives the core to the end (it raises if an agent is
    left unfinished): every agent commits or runs out of attempts, and every wait is woken."""
    run = scaling.simulate_contention(24, frontier=frontier, attempts=3)
    assert run.agents == 24 and run.commits >= 1
    assert run.commits + run.aborts >= 24 and run.waits == run.wakes


def test_disjoint_agents_never_wait_in_the_core_simulation() -> None:
    run = scaling.simulate_contention(16, resources=16)
    assert run.commits == 16 and run.aborts == 0 and run.waits == 0
