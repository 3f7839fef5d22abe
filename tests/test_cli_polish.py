"""The CLI's finish: did-you-mean, one-line errors, resume from the stored config, --limit,
plain progress lines, the time estimate, 80-column tables and one spelling of a cell."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from test_cli import CONFIG, TOTAL, TRIALS, invoke, records, run_dirs, write_config

from harness.cli import progress


def _err_lines(result: Any) -> list[str]:
    return [line for line in result.stderr.strip().splitlines() if line.strip()]


# ------------------------------------------------------------------ 1. did you mean


def test_did_you_mean_config_path(tmp_path: Path) -> None:
    write_config(tmp_path, name="tau_retail.yaml")
    result = invoke("run", tmp_path / "tau_retal.yaml", "--out", tmp_path / "r")
    assert result.exit_code == 2
    assert "no such file" in result.stderr
    assert f"did you mean {tmp_path / 'tau_retail.yaml'}?" in result.stderr.replace("\n", "")


def test_did_you_mean_mode_blames_the_flag(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = invoke("run", config, "--modes", "tx-ful", "--out", tmp_path / "r")
    assert result.exit_code == 2
    (line,) = _err_lines(result)
    assert "--modes" in line and "did you mean tx-full?" in line
    assert "tiny.yaml" not in line


def test_did_you_mean_config_keys_in_yaml_and_set(tmp_path: Path) -> None:
    data = copy.deepcopy(CONFIG)
    data["faults"]["rat"] = 0.1
    bad = write_config(tmp_path, data, name="bad.yaml")
    result = invoke("validate", bad)
    assert result.exit_code == 2
    assert "unknown key faults.rat; did you mean faults.rate?" in result.stderr
    good = write_config(tmp_path)
    for command in ("run", "sweep"):
        result = invoke(command, good, "--set", "faults.rat=0.1", "--out", tmp_path / "r")
        assert result.exit_code == 2
        (line,) = _err_lines(result)
        assert "--set" in line and "unknown key faults.rat; did you mean faults.rate?" in line


def test_did_you_mean_workload(tmp_path: Path) -> None:
    data = copy.deepcopy(CONFIG)
    data["workload"] = "synthetc"
    result = invoke("validate", write_config(tmp_path, data))
    assert result.exit_code == 2 and "did you mean synthetic?" in result.stderr


# ------------------------------------------------------------------ 2. one line per error


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--set", "faults.rat=0.1"], "--set"),
        (["--modes", "tx-ful"], "--modes"),
        (["--trials", "0"], "--trials"),
        (["--trials", "x"], "--trials"),
        (["--seed", "x"], "--seed"),
    ],
)
def test_bad_flag_is_one_line_naming_it(tmp_path: Path, args: list[str], flag: str) -> None:
    config = write_config(tmp_path)
    result = invoke("run", config, *args, "--out", tmp_path / "r")
    assert result.exit_code == 2
    lines = _err_lines(result)
    assert len(lines) == 1, result.stderr
    assert flag in lines[0]
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ 3. resume from the manifest


def _interrupted(tmp_path: Path) -> tuple[Path, Path]:
    """A run with only part of its trials done (made with --limit 1)."""
    config = write_config(tmp_path)
    result = invoke("run", config, "--out", tmp_path / "r", "--jobs", 1, "--limit", 1)
    assert result.exit_code == 0, result.output
    (run_dir,) = run_dirs(tmp_path / "r")
    return config, run_dir


def test_resume_without_the_yaml_uses_the_stored_config(tmp_path: Path) -> None:
    config, run_dir = _interrupted(tmp_path)
    config.unlink()  # the YAML is gone: the manifest is enough
    for command in ("run", "sweep"):
        result = invoke(command, "--resume", run_dir, "--jobs", 1, "--quiet")
        assert result.exit_code == 0, result.output
    assert len(records(run_dir)) == TOTAL


def test_resume_with_a_different_config_names_the_key(tmp_path: Path) -> None:
    config, run_dir = _interrupted(tmp_path)
    result = invoke("run", config, "--resume", run_dir, "--trials", TRIALS + 7)
    assert result.exit_code == 2
    assert f"trials: {TRIALS} in the run, {TRIALS + 7} now" in result.stderr
    # Backward compatible: CONFIG.yaml with --resume still resumes.
    result = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------ 4. --limit


def test_limit_runs_the_first_trials_and_resume_completes(tmp_path: Path) -> None:
    config, run_dir = _interrupted(tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["limit"] == 1 and manifest["trials_planned"] == TOTAL // TRIALS
    assert {r["trial"] for r in records(run_dir)} == {0}
    result = invoke("run", "--resume", run_dir, "--jobs", 1)
    assert result.exit_code == 0, result.output
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "limit" not in manifest and manifest["trials_planned"] == TOTAL
    assert sorted({r["trial"] for r in records(run_dir)}) == list(range(TRIALS))
    # Same records as a run without --limit.
    full = invoke("run", config, "--out", tmp_path / "full", "--jobs", 1)
    assert full.exit_code == 0
    (whole,) = run_dirs(tmp_path / "full")

    def strip(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(({k: v for k, v in r.items() if k != "timings"} for r in recs), key=lambda r: r["key"])

    assert strip(records(run_dir)) == strip(records(whole))


# ------------------------------------------------------------------ 5-6. progress and estimate


def test_plain_progress_lines_and_estimate_when_not_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "PROGRESS_QUIET_S", 0.0)
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(progress, "ESTIMATE_AFTER_TRIALS", 1)
    monkeypatch.setattr(progress, "ESTIMATE_OVER_S", -1.0)  # every run is "long"
    config = write_config(tmp_path)
    result = invoke("run", config, "--out", tmp_path / "r", "--jobs", 1)
    assert result.exit_code == 0, result.output
    lines = _err_lines(result)
    assert any(f"tiny: {TOTAL}/{TOTAL} trials (100%)" in line for line in lines), lines
    assert any("trials/s, ETA" in line for line in lines), lines
    assert any(f"{TOTAL:,} trials, about" in line and "estimate" in line for line in lines)
    assert "━" not in result.stderr  # no rich bar in a pipe
    quiet = invoke("run", config, "--out", tmp_path / "q", "--jobs", 1, "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr.strip() == ""


# ------------------------------------------------------------------ 7. 80 columns


def test_wide_table_at_80_columns_keeps_row_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = copy.deepcopy(CONFIG)
    data["modes"] = ["tx-full", "no-frontier", "saga", "checkpoint-replay", "occ", "tcc", "no-tx"]
    data["trials"] = 1
    data["grid"] = {"faults.rate": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]}
    data["cells"] = [{"label": c, "faults.classes": c} for c in ("F1", "F2", "F4")]
    data["labels"] = {"label": "class", "faults.rate": "fp"}
    data["report"]["tables"][0]["columns"] = ["fp", "class"]
    config = write_config(tmp_path, data)
    assert invoke("run", config, "--out", tmp_path / "r", "--jobs", 2, "-q").exit_code == 0
    (run_dir,) = run_dirs(tmp_path / "r")
    monkeypatch.setenv("COLUMNS", "80")
    out = invoke("report", run_dir).stdout
    table_lines = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
    assert table_lines and max(len(line) for line in table_lines) <= 80
    assert "part 1 of" in out
    ids = {r["cell_id"] for r in records(run_dir)}
    for cid in ids:  # every cell named whole, as its records name it
        assert cid in out, cid
    assert "…" not in out


# ------------------------------------------------------------------ 8. one spelling


def test_one_spelling_of_a_cell(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    # `fp=0` pins the grid's 0.0: the cell is the same cell as in a full run.
    result = invoke("run", config, "--set", "fp=0", "--out", tmp_path / "r", "--jobs", 1, "-q")
    assert result.exit_code == 0, result.output
    (run_dir,) = run_dirs(tmp_path / "r")
    assert {r["cell_id"] for r in records(run_dir)} == {"fp=0.0"}
    assert "fp=0.0" in result.stdout  # the table header spells it as cell_id does
    md = (run_dir / "tables" / "clean.md").read_text()
    assert "fp=0.0" in md
