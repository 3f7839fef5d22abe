"""tau_contention's agents as OS processes, on the real clock (harness.bench.contention_processes).

With a SQLite coordinator the agents' read-modify-writes of shared orders break no invariant,
as on the virtual clock; the same agents without a coordinator (a Runtime per process) lose
updates. The control's overlap comes from the scenario's seeded plan delays, which force the
agents sharing an order to read it before either writes in these trials; real-clock jitter
could in principle undo one trial's overlap, hardly all three.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.bench import contention_processes as cp

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tau_contention.yaml"

AGENTS = 3
TRIALS = 3


def test_a_coordinator_keeps_the_invariants_across_processes(tmp_path: Path) -> None:
    params, seed = cp.contention_params(AGENTS, CONFIG)
    url = f"sqlite://{tmp_path}/coordinator.db"
    with_coordinator = cp.run_mode(url, AGENTS, TRIALS, workdir=tmp_path / "tx", params=params,
                                   seed=seed)
    control = cp.run_mode(None, AGENTS, TRIALS, workdir=tmp_path / "control", params=params,
                          seed=seed)
    for result in (with_coordinator, control):
        assert result.errors == []
        assert [len(runs) for runs in result.runs] == [AGENTS] * TRIALS
        assert len({r.agent for runs in result.runs for r in runs}) == AGENTS
    assert with_coordinator.violations == [0] * TRIALS
    assert with_coordinator.commits == AGENTS * TRIALS
    # The coordinator saw the conflicts (an abort or a wait), so the zero above is earned.
    assert with_coordinator.aborts + sum(w > 0 for w in with_coordinator.waits_ms) > 0
    assert sum(control.violations) > 0, control.violations
    assert control.aborts == 0  # each process alone sees no conflict: the updates are lost

    virtual = cp.virtual_run(AGENTS, TRIALS, CONFIG)
    assert virtual.violations == [0] * TRIALS


def test_the_oracle_counts_a_lost_update(tmp_path: Path) -> None:
    """The judge is the scenario's own oracle: an agent reported committed whose tag is not
    in its order's row is a violation."""
    params, seed = cp.contention_params(AGENTS, CONFIG)
    sc = cp.scenario(params, seed, 0)
    rows = tmp_path / "rows.db"
    cp.seed_rows(rows, sc)
    runs = [cp.AgentRun(0, i, committed=True) for i in range(AGENTS)]
    assert cp.judge(rows, sc, runs) == AGENTS  # nothing was written: every commit is lost
    assert cp.judge(rows, sc, [cp.AgentRun(0, i) for i in range(AGENTS)]) == 0


@pytest.mark.parametrize(
    "argv", [["--agents", "0"], ["--trials", "-1"], ["--coordinator", "mysql://x"],
             ["--config", "/nonexistent.yaml"], ["--agentz", "3"]],
)
def test_bad_arguments_exit_non_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cp.main(argv)
    assert exc.value.code == 2
    assert "contention_processes" in capsys.readouterr().err
