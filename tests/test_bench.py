"""The benchmark script runs end to end (its figures are not asserted: speed is read, not
tested); each phase checks its own results, so a broken runtime fails here."""

from __future__ import annotations

import pytest

from atomix import bench


def test_quick_benchmark_runs_and_reports_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for line in ("(a) shimmed bufferable call", "(b) transaction with 4", "(c) speculation"):
        assert line in out
    for k in (2, 4, 8, 16):
        assert any(row.split()[:1] == [str(k)] for row in out.splitlines())
    assert "K = 16 per branch" in out and "K = 16 target" in out
    assert "machine reference" in out


def test_speculation_bench_checks_that_exactly_the_winner_committed() -> None:
    setup, settle, total = bench.bench_speculation(4, 20)
    assert setup.n == settle.n == total.n == 20
    assert 0 < setup.median <= total.median
