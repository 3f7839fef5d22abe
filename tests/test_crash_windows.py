"""Paper Table 19: a real child process SIGKILLed at each crash window of a one-row SQLite
commit, recovered, and judged from the SQLite file; the config maps the paper's rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.experiment.config import load_config
from harness.experiment.runner import plan
from harness.experiment.trial import TrialSpec, run_trial
from harness.workloads.crash_child import WINDOWS
from harness.workloads.crash_windows import CrashError, _kill_and_recover

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "crash_windows.yaml"

#: window -> (committed mark durable at the kill, row applied at the kill, row there after recovery)
EXPECTED = {
    "before_intent": (False, False, False),
    "after_intent": (False, False, False),
    "after_commit_mark": (True, False, True),
    "after_apply": (True, True, True),
    "after_settled_mark": (True, True, True),
}


def spec(window: str, trial: int = 0) -> TrialSpec:
    return TrialSpec(
        config="crash_windows", workload="crash_windows", mode="tx-full",
        cell_id=f"window={window}", cell={"window": window}, trial=trial, seed=19,
        params={"window": window},
    )


def test_the_windows_are_the_childs() -> None:
    assert set(EXPECTED) == set(WINDOWS)


@pytest.mark.parametrize("window", list(EXPECTED))
def test_sigkill_at_each_window_then_recovery(window: str) -> None:
    marked, applied, present = EXPECTED[window]
    # Trials 0 and 2 differ in how many committed transactions come first (seeded 0-2).
    for trial in (0, 2):
        m = run_trial(spec(window, trial))["metrics"]
        assert (m["commit_marked"], m["applied_at_kill"], not m["lost"]) == (marked, applied, present)
        assert m["duplicated_rows"] == 0
        assert not m["lost_committed"] and not m["applied_uncommitted"]
        assert m["prior_intact"] and m["recovery_clean"]
        # Recovery finishes exactly the transactions with a durable committed mark and aborts
        # one that has an intent but no mark; before the intent there is nothing to recover.
        assert m["recovered_finished"] == int(marked)
        assert m["recovered_aborted"] == int(window == "after_intent")


def test_same_seed_same_record_apart_from_timings() -> None:
    first, second = run_trial(spec("after_apply", 1)), run_trial(spec("after_apply", 1))
    first.pop("timings"), second.pop("timings")
    assert first == second


def test_a_child_that_does_not_die_at_its_window_fails_the_trial(tmp_path: Path) -> None:
    with pytest.raises(CrashError, match="unknown window"):
        _kill_and_recover(tmp_path / "x", "no_such_window", 0)


def test_the_config_maps_table_19_at_the_papers_n() -> None:
    config = load_config(CONFIG)
    assert config.trials == 50
    (entry,) = [e for e in config.paper if e.table == 19]
    assert set(entry.columns) == {"Trials", "Lost effects"}
    assert len(plan(config)) == 50 * len(WINDOWS)
