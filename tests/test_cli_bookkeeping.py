"""Run bookkeeping through the real `atomix` command: comparing two runs, listing runs with
their limits and overrides, retrying errored trials in place, selecting tasks by id, the
grouped `list`, and help text that is never cut mid-sentence, all at 80 columns."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support import read_records, run_dirs, write_yaml

from harness.analysis.paired import mcnemar_exact

WIDTH = 80
TRIALS = 12
CONFIG: dict[str, Any] = {
    "name": "books",
    "description": "bookkeeping smoke test",
    "workload": "synthetic",
    "seed": 5,
    "trials": TRIALS,
    "modes": ["tx-full", "no-tx"],
    "faults": {"classes": ["F1", "F2"]},
    "labels": {"faults.rate": "fp"},
    "grid": {"faults.rate": [0.0, 0.3]},
}
TOTAL = 2 * TRIALS * 2


def invoke(*args: Any) -> Any:
    """`atomix ARGS` at 80 columns, through typer's CliRunner."""
    from typer.testing import CliRunner

    from cli import app

    return CliRunner().invoke(
        app, [str(a) for a in args], catch_exceptions=False, env={"COLUMNS": str(WIDTH)}
    )


def fits(text: str) -> None:
    """Every line within 80 columns (but a line naming a long path: a path is not wrapped)
    and nothing cut with an ellipsis."""
    for line in text.splitlines():
        if not line.startswith(("RUN_A = ", "RUN_B = ", "wrote ")):
            assert len(line.rstrip()) <= WIDTH, line
        assert "…" not in line, line


def records(run_dir: Path) -> list[dict[str, Any]]:
    return read_records(run_dir / "trials.jsonl")


def strip(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    drop = ("timings", "retry")
    return {r["key"]: {k: v for k, v in r.items() if k not in drop} for r in recs}


def one_run(base: Path, *args: Any, data: dict[str, Any] | None = None) -> Path:
    config = write_yaml(base / "books.yaml", data or CONFIG)
    out = base / "results"
    before = set(run_dirs(out))
    result = invoke("run", config, "--out", out, "--jobs", 1, "--quiet", *args)
    assert result.exit_code == 0, result.output
    (run_dir,) = set(run_dirs(out)) - before
    return run_dir


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("books")
    return one_run(base), one_run(base)


# ------------------------------------------------------------------ compare RUN_A RUN_B


def test_compare_two_identical_runs_pairs_every_trial_and_finds_no_difference(
    two_runs: tuple[Path, Path],
) -> None:
    a, b = two_runs
    result = invoke("compare", a, b)
    assert result.exit_code == 0, result.output
    out = result.stdout
    fits(out)
    # Same config and seed: every pair concordant, in every mode x cell.
    assert out.count("+0/-0") == 4
    assert "RUN_B vs RUN_A: better on 0 of 4 cells (mode x cell), worse on 0, no evidence" in (
        " ".join(out.split())
    )
    assert "fp=0.0" in out and "fp=0.3" in out and "checkpoint" not in out


def test_compare_two_runs_finds_a_run_that_is_worse(
    two_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two_runs
    worse = tmp_path / "books" / "worse"
    worse.mkdir(parents=True)
    (worse / "manifest.json").write_bytes((b / "manifest.json").read_bytes())
    # RUN_B's no-tx fails every fp=0.0 trial that RUN_A's passed: a paired loss on each.
    recs = records(b)
    lost = 0
    for r in recs:
        if r["mode"] == "no-tx" and r["cell_id"] == "fp=0.0" and r["metrics"]["clean"]:
            r["metrics"]["clean"] = False
            lost += 1
    assert lost >= 8, "the fault-free cell should be mostly clean"
    (worse / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    result = invoke("compare", a, worse)
    assert result.exit_code == 0, result.output
    out = result.stdout
    fits(out)
    assert f"+0/-{lost}" in out
    flat = " ".join(out.split())
    # Holm over 4 tests, the other three with p = 1.
    p = min(1.0, 4 * mcnemar_exact(0, lost))
    assert p < 0.05
    assert "RUN_B vs RUN_A: better on 0 of 4 cells (mode x cell), worse on 1," in flat
    assert re.search(r"no-tx\s+better on 0 of 2 cells, worse on 1", flat)


def test_compare_two_runs_refuses_bad_input(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_runs
    for args, where in (
        ((a, a), "same run"),
        ((a, b, "--baseline", "tx-full"), "--baseline"),
        ((a, b, "--modes", "tx-ful"), "did you mean tx-full"),
        ((a, b, "--metric", "claen"), "did you mean clean"),
        ((a, tmp_path / "nope"), "not a run directory"),
    ):
        result = invoke("compare", *args)
        assert result.exit_code == 2, (args, result.output)
        assert where in " ".join(result.stderr.split()), (args, result.stderr)


def test_single_run_compare_reads_at_80_columns_with_verdicts(two_runs: tuple[Path, Path]) -> None:
    a, _ = two_runs
    result = invoke("compare", a)
    assert result.exit_code == 0, result.output
    fits(result.stdout)
    flat = " ".join(result.stdout.split())
    assert "Verdicts against tx-full (clean, Holm, alpha 0.05):" in flat
    assert re.search(r"no-tx better on \d of 2 cells, worse on \d, no evidence on the rest", flat)
    assert (a / "tables" / "compare-clean-vs-tx-full.csv").is_file()


# ------------------------------------------------------------------ runs


def test_runs_shows_true_completion_limits_overrides_and_sweep_keys(tmp_path: Path) -> None:
    run_dir = one_run(tmp_path, "--limit", 2, "--trials", 6, "--set", "faults.rate=0.3")
    result = invoke("runs", "--out", tmp_path / "results")
    assert result.exit_code == 0, result.output
    out = result.stdout
    fits(out)
    flat = " ".join(out.split())
    # --set pins the grid key to one cell: 1 cell x 6 trials x 2 modes, 2 trials run.
    assert "4/12 trials (limit 2)" in flat
    assert f"books/{run_dir.name} partial" in flat
    assert "overrides: trials=6, faults.rate=0.3" in flat
    assert "sweep: fp=0.3" in flat
    assert "complete" not in flat
    # Resumed without --limit, the run is whole.
    assert invoke("run", "--resume", run_dir, "--jobs", 1, "--quiet").exit_code == 0
    flat = " ".join(invoke("runs", "--out", tmp_path / "results").stdout.split())
    assert "12/12 trials," in flat and "complete" in flat and "limit" not in flat


def test_runs_with_no_runs_is_an_error(tmp_path: Path) -> None:
    result = invoke("runs", "--out", tmp_path / "none")
    assert result.exit_code == 2 and "no runs under" in result.stderr


# ------------------------------------------------------------------ run --retry-failed


def _mark_errored(run_dir: Path, keys: list[str]) -> None:
    """Make the records of `keys` say the model server timed out (an LLM agent's record)."""
    lines = (run_dir / "trials.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        r = json.loads(line)
        if r["key"] in keys:
            r["agents"][0]["llm"] = {
                "stop": "timeout",
                "failed_requests": [{"attempt": 1, "step": 1, "error": "no answer in 1 s"}],
            }
            r["metrics"]["clean"] = False
        out.append(json.dumps(r, sort_keys=True, separators=(",", ":")))
    (run_dir / "trials.jsonl").write_text("\n".join(out) + "\n")


def test_retry_failed_reruns_only_errored_trials_in_place(tmp_path: Path) -> None:
    run_dir = one_run(tmp_path)
    original = strip(records(run_dir))
    keys = sorted(original)[:2]
    _mark_errored(run_dir, keys)
    untouched = {
        line for line in (run_dir / "trials.jsonl").read_text().splitlines()
        if json.loads(line)["key"] not in keys
    }  # fmt: skip
    result = invoke("run", "--retry-failed", run_dir, "--jobs", 1)
    assert result.exit_code == 0, result.output
    assert "retried 2 errored trial(s)" in " ".join(result.stdout.split())
    recs = records(run_dir)
    # One record per trial, none duplicated; the others byte for byte as they were.
    assert len(recs) == TOTAL == len({r["key"] for r in recs})
    lines = (run_dir / "trials.jsonl").read_text().splitlines()
    assert untouched <= set(lines)
    # Same spec, same seed: the retried records are the original ones (apart from timings).
    assert strip(recs) == original
    retried = {r["key"]: r for r in recs if "retry" in r}
    assert sorted(retried) == keys
    for r in retried.values():
        assert r["retry"]["attempt"] == 2 and r["retry"]["replaces"] == 1
        assert "no answer in 1 s" in r["retry"]["error"] and r["retry"]["at"]
    # The audit trail keeps the errored records whole.
    audit = [json.loads(x) for x in (run_dir / "trials.retried.jsonl").read_text().splitlines()]
    assert sorted(e["record"]["key"] for e in audit) == keys
    assert all(e["record"]["agents"][0]["llm"]["stop"] == "timeout" for e in audit)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["retries"][-1]["trials"] == 2 and manifest["retries"][-1]["still_errored"] == 0
    # The tables were rebuilt from the replaced records.
    assert (run_dir / "tables" / "clean.csv").is_file()
    flat = " ".join(invoke("runs", "--out", tmp_path / "results").stdout.split())
    assert "retried: 2 errored trial(s)" in flat
    # Nothing errored is left: a second retry runs nothing.
    again = invoke("run", "--retry-failed", run_dir)
    assert again.exit_code == 0 and "no errored trials" in again.stdout
    assert len((run_dir / "trials.retried.jsonl").read_text().splitlines()) == 2


def test_retry_failed_refuses_bad_input(tmp_path: Path) -> None:
    run_dir = one_run(tmp_path, "--limit", 1)
    for args, where in (
        ((tmp_path / "nope",), "not a run directory"),
        ((run_dir, "--trials", 3), "--trials"),
        ((run_dir, "--resume", run_dir), "--resume"),
        ((run_dir, "--tasks", "1"), "--tasks"),
    ):
        result = invoke("run", "--retry-failed", *args)
        assert result.exit_code == 2, (args, result.output)
        assert where in result.stderr, (args, result.stderr)


# ------------------------------------------------------------------ --tasks

TAU: dict[str, Any] = {
    "name": "tau_books",
    "workload": "tau_retail",
    "params": {"split": "test", "sample": 5, "task_seed": 0},
    "seed": 3,
    "trials": 10,  # two replicates of each of the 5 tasks
    "modes": ["tx-full"],
    "faults": {"classes": "mixed", "rate": 0.1},
    "agent": {"kind": "gold"},
}


def test_tasks_selects_the_trials_of_those_tasks(tmp_path: Path) -> None:
    from harness.workloads import get_workload

    ids = [str(t["id"]) for t in get_workload("tau_retail").tasks(TAU["params"])]
    chosen = [ids[3], ids[1]]
    run_dir = one_run(tmp_path, "--tasks", ",".join(chosen), data=TAU)
    recs = records(run_dir)
    # Trial t performs task ids[t % 5]: two replicates of each chosen task.
    assert sorted(r["trial"] for r in recs) == [1, 3, 6, 8]
    assert {r["agents"][0]["task"] for r in recs} == {f"task{i}" for i in chosen}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["tasks"] == chosen and manifest["trials_total"] == 10
    flat = " ".join(invoke("runs", "--out", tmp_path / "results").stdout.split())
    assert f"4/10 trials (tasks {','.join(chosen)})" in flat
    # The same trials as a whole run's: resuming without --tasks runs the rest.
    assert invoke("run", "--resume", run_dir, "--jobs", 1, "--quiet").exit_code == 0
    whole = strip(records(run_dir))
    assert len(whole) == 10
    full = one_run(tmp_path / "full", data=TAU)
    assert strip(records(full)) == whole


def test_tasks_refuses_unknown_ids_and_workloads_without_tasks(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "tau.yaml", TAU)
    result = invoke("run", config, "--out", tmp_path / "r", "--tasks", "12,99999")
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "--tasks" in err and "unknown task id(s) 99999" in err and "tasks are:" in err
    for bad in ("3,,4", "3,3"):
        result = invoke("run", config, "--out", tmp_path / "r", "--tasks", bad)
        assert result.exit_code == 2 and "--tasks" in result.stderr, result.stderr
    synthetic = write_yaml(tmp_path / "books.yaml", CONFIG)
    result = invoke("run", synthetic, "--out", tmp_path / "r", "--tasks", "1")
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "'synthetic' has no task ids" in err and "tau_retail" in err
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ list


def test_list_is_grouped_short_and_reads_at_80_columns() -> None:
    result = invoke("list")
    assert result.exit_code == 0, result.output
    out = result.stdout
    lines = out.splitlines()
    # One line per item: a summary too long for the line is cut (with its details one
    # command away), never wrapped.
    for line in lines:
        assert len(line.rstrip()) <= WIDTH, line
    titles = [
        line for line in lines if re.match(r"(Modes|Workloads|Configs|Fault classes) \(", line)
    ]
    assert [t.split(" (")[0] for t in titles] == ["Modes", "Workloads", "Configs", "Fault classes"]
    items = sum(int(re.search(r"\((\d+)\)", t).group(1)) for t in titles)  # type: ignore[union-attr]
    body = [line for line in lines if line.strip() and line not in titles]
    families = [line for line in body if line.startswith("(")]  # the modes' family headings
    assert [f.split(")")[0] for f in families][:3] == ["(atomix", "(baseline", "(ablation"]
    assert len(body) == items + len(families) + 2, body[-3:]  # + the hint's two lines
    assert "atomix list SECTION NAME" in out


def test_list_one_section_and_one_item() -> None:
    modes = invoke("list", "modes")
    assert modes.exit_code == 0
    assert "Modes (" in modes.stdout and "Workloads (" not in modes.stdout
    one = invoke("list", "modes", "tx-full")
    assert one.exit_code == 0
    flat = " ".join(one.stdout.split())
    assert "tx-full" in flat and "family atomix" in flat
    work = invoke("list", "workloads", "tau_retail")
    assert "task ids yes (--tasks)" in " ".join(work.stdout.split())
    verbose = invoke("list", "modes", "--verbose")
    assert len(verbose.stdout) > len(modes.stdout)


def test_list_refuses_unknown_sections_and_names() -> None:
    result = invoke("list", "mdoes")
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "did you mean modes" in err and "modes, workloads, configs, faults" in err
    result = invoke("list", "modes", "tx-ful")
    assert result.exit_code == 2 and "did you mean tx-full" in " ".join(result.stderr.split())


# ------------------------------------------------------------------ --help


def _commands() -> list[Any]:
    from cli import app

    return list(app.registered_commands)


def test_every_command_has_a_one_sentence_short_help() -> None:
    for info in _commands():
        text = info.short_help
        assert text, f"{info.name} has no short_help"
        assert text.endswith(".") and text.count(". ") == 0, (info.name, text)
        # Fits beside the longest command name in the 80-column commands panel.
        assert len(text) <= WIDTH - 18, (info.name, len(text))


def test_help_lists_each_command_on_one_whole_line() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    fits(result.stdout)
    panel = result.stdout.split("Commands")[1].split("╰")[0]
    rows = [line for line in panel.splitlines()[1:] if line.strip("│ ")]
    assert len(rows) == len(_commands()), rows
    for info in _commands():
        assert any(info.short_help in row for row in rows), info.name


@pytest.mark.parametrize("name", [info.name for info in _commands()])
def test_each_command_help_reads_at_80_columns(name: str) -> None:
    result = invoke(name, "--help")
    assert result.exit_code == 0, result.output
    fits(result.stdout)
