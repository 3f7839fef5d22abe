"""The `atomix` command, driven through typer's CliRunner on tiny synthetic configs."""

from __future__ import annotations

import copy
import hashlib
import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from support import invoke, read_records, run_dirs, without_timings, write_yaml

from atomix import __version__

MODES = ["tx-full", "no-tx"]
TRIALS = 3
RATES = [0.0, 0.3]
CONFIG: dict[str, Any] = {
    "name": "tiny",
    "description": "a tiny synthetic smoke test",
    "workload": "synthetic",
    "seed": 11,
    "trials": TRIALS,
    "modes": MODES,
    "faults": {"classes": ["F1", "F2", "F4"]},
    "labels": {"faults.rate": "fp"},
    "grid": {"faults.rate": RATES},
    "report": {
        "tables": [
            {"name": "clean", "metric": "clean", "columns": ["fp"], "title": "Clean trials"},
            {
                "name": "leaks",
                "metric": "duplicates",
                "kind": "per_1000",
                "columns": ["faults.rate"],
            },
        ],
        "plots": [{"table": "clean", "kind": "line", "x": "fp"}, {"table": "leaks"}],
        "main": "clean",
    },
}
TOTAL = len(RATES) * TRIALS * len(MODES)


def write_config(
    directory: Path, data: dict[str, Any] | None = None, name: str = "tiny.yaml"
) -> Path:
    return write_yaml(directory / name, CONFIG if data is None else data)


def records(run_dir: Path) -> list[dict[str, Any]]:
    return read_records(run_dir / "trials.jsonl")


def hashes(run_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """(config path, run dir, CLI result) of one finished run with --jobs 1."""
    base = tmp_path_factory.mktemp("finished")
    config = write_config(base)
    result = invoke("run", config, "--out", base / "results", "--jobs", 1)
    assert result.exit_code == 0, result.output
    (run_dir,) = run_dirs(base / "results")
    return config, run_dir, result


def test_run_writes_records_tables_plots_and_prints_the_table(
    finished: tuple[Path, Path, Any],
) -> None:
    _, run_dir, result = finished
    assert run_dir.parent.name == "tiny"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["trials_planned"] == TOTAL
    recs = records(run_dir)
    assert len(recs) == TOTAL == len({r["key"] for r in recs})
    for table in ("clean", "leaks"):
        for suffix in ("md", "csv", "tex"):
            assert (run_dir / "tables" / f"{table}.{suffix}").stat().st_size > 0
    for plot in ("clean-line", "leaks-bar"):
        for suffix in ("png", "pdf"):
            assert (run_dir / "plots" / f"{plot}.{suffix}").stat().st_size > 0
    out = result.stdout
    assert "Clean trials" in out and "fp=0.3" in out and "tx-full" in out
    assert f"N = {TRIALS} per cell" in out and "Clopper–Pearson" in out
    assert str(run_dir) in out
    assert f"{TOTAL} trials in " in out and "trials/s" in out


def test_known_metrics_are_in_every_record(finished: tuple[Path, Path, Any]) -> None:
    from harness.analysis.runs import KNOWN_METRICS

    for record in records(finished[1]):
        assert KNOWN_METRICS <= set(record["metrics"])


def test_jobs_do_not_change_records(finished: tuple[Path, Path, Any], tmp_path: Path) -> None:
    config, run_dir, _ = finished
    result = invoke("run", config, "--out", tmp_path, "--jobs", 2)
    assert result.exit_code == 0, result.output
    (parallel,) = run_dirs(tmp_path)
    assert without_timings(records(parallel)) == without_timings(records(run_dir))


def _broken(change: str) -> dict[str, Any]:
    data = copy.deepcopy(CONFIG)
    if change == "unknown key":
        data["faults"]["bogus_knob"] = 1
    elif change == "rate out of range":
        data["grid"]["faults.rate"] = [0.1, 1.5]
    elif change == "unknown mode":
        data["modes"] = ["tx-full", "no-such-mode"]
    elif change == "wrong type":
        data["trials"] = "many"
    elif change == "unknown plot table":
        data["report"]["plots"] = [{"table": "nope"}]
    elif change == "unknown table column":
        data["report"]["tables"][0]["columns"] = ["rate"]
    elif change == "unknown metric":
        data["report"]["tables"][1]["metric"] = "cleanliness"
    return data


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ("unknown key", "faults.bogus_knob"),
        ("rate out of range", "faults.rate"),
        ("unknown mode", "modes"),
        ("wrong type", "trials"),
        ("unknown plot table", "report.plots.0.table"),
        ("unknown table column", "report.tables.0.columns"),
        ("unknown metric", "report.tables.1.metric"),
    ],
)
def test_broken_config_exits_2_naming_file_and_key(tmp_path: Path, change: str, key: str) -> None:
    config = write_config(tmp_path, _broken(change), name="broken.yaml")
    out = tmp_path / "results"
    for command in ("run", "validate"):
        result = invoke(command, config, *(["--out", out] if command == "run" else []))
        assert result.exit_code == 2, result.output
        assert "broken.yaml" in result.stderr and key in result.stderr, result.stderr
    assert not out.exists(), "a broken config must write nothing"


def test_unreadable_and_bad_yaml_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trials: [1, 2\n", encoding="utf-8")
    for path in (bad, tmp_path / "missing.yaml"):
        result = invoke("run", path, "--out", tmp_path / "results")
        assert result.exit_code == 2
        assert path.name in result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "{config}", "--set", "faults.rate"],
        ["sweep", "{config}", "--set", "=1,2"],
        ["run", "{config}", "--modes", "tx-full,,no-tx"],
        ["run", "{config}", "--trials", "0"],
        ["compare", "{run}", "--modes", "tx-full", "--test", "chi2"],
        ["list", "everything"],
    ],
)
def test_bad_cli_values_exit_2(
    finished: tuple[Path, Path, Any], tmp_path: Path, args: list[str]
) -> None:
    config, run_dir, _ = finished
    filled = [a.format(config=config, run=run_dir) for a in args]
    result = invoke(*filled, *(["--out", tmp_path] if filled[0] in ("run", "sweep") else []))
    assert result.exit_code == 2, result.output
    assert (
        "Invalid value" in result.output or "must be" in result.output or "Usage" in result.output
    )
    assert not run_dirs(tmp_path)


def test_sweep_set_with_missing_equals_says_what_is_expected(
    finished: tuple[Path, Path, Any],
) -> None:
    result = invoke("sweep", finished[0], "--set", "faults.rate")
    assert result.exit_code == 2
    assert "KEY=V1,V2" in result.output


def test_report_regenerates_byte_identical_files(
    finished: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    _, original, _ = finished
    run_dir = tmp_path / "copy"
    shutil.copytree(original, run_dir)
    before = hashes(run_dir)
    shutil.rmtree(run_dir / "tables")
    shutil.rmtree(run_dir / "plots")
    result = invoke("report", run_dir)
    assert result.exit_code == 0, result.output
    assert hashes(run_dir) == before  # records and manifest untouched, every output identical
    assert "Clean trials" in result.stdout


def test_report_without_arguments_takes_the_latest_run_of_each_config(
    finished: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    _, original, _ = finished
    results = tmp_path / "results"
    latest = results / "tiny" / original.name
    older = results / "tiny" / "20000101-000000"
    shutil.copytree(original, latest)
    shutil.copytree(original, older)
    other = results / "other" / "20000101-000000"
    shutil.copytree(original, other)
    for d in (latest, older, other):
        shutil.rmtree(d / "tables")
    result = invoke("report", "--results", results)
    assert result.exit_code == 0, result.output
    assert (latest / "tables" / "clean.md").exists()
    assert (other / "tables" / "clean.md").exists()
    assert not (older / "tables").exists()
    empty = invoke("report", "--results", tmp_path / "nothing")
    assert empty.exit_code == 2 and "no runs" in empty.stderr


def test_compare_prints_rates_and_p_values(
    finished: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    _, original, _ = finished
    run_dir = tmp_path / "run"
    shutil.copytree(original, run_dir)
    result = invoke("compare", run_dir, "--modes", "tx-full,no-tx")
    assert result.exit_code == 0, result.output
    assert "McNemar" in result.stdout and "Holm" in result.stdout
    assert "fp=0.3" in result.stdout and "[" in result.stdout
    stem = run_dir / "tables" / "compare-clean-vs-tx-full-no-tx"
    csv_text = stem.with_name(stem.name + ".csv").read_text()
    rows = [line.split(",") for line in csv_text.splitlines()[1:]]
    assert len(rows) == len(RATES)  # one line per cell: no-tx against tx-full
    assert all(0.0 <= float(r[-2]) <= 1.0 for r in rows)
    assert stem.with_name(stem.name + ".md").exists()
    missing = invoke("compare", run_dir, "--modes", "tx-full,saga")
    assert missing.exit_code == 2 and "saga" in missing.stderr


def test_sweep_adds_grid_keys(tmp_path: Path) -> None:
    config = write_config(tmp_path, {**CONFIG, "trials": 2, "report": {}})
    result = invoke(
        "sweep", config, "--set", "faults.rate=0,0.5", "--set", "faults.classes=F1,F4",
        "--out", tmp_path / "results", "--jobs", 1,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (run_dir,) = run_dirs(tmp_path / "results")
    recs = records(run_dir)
    cells = {r["cell_id"] for r in recs}
    assert len(cells) == 4  # the grid's faults.rate was replaced, faults.classes added
    assert {r["cell"]["fp"] for r in recs} == {0, 0.5}
    assert len(recs) == 4 * 2 * len(MODES)
    assert (run_dir / "tables" / "clean.md").exists() and (
        run_dir / "plots" / "clean-bar.png"
    ).exists()


def test_run_set_overrides_a_key_and_pins_a_label_of_the_grid(tmp_path: Path) -> None:
    # configs/README.md documents `run --set`; a label (fp) names its dotted key.
    config = write_config(tmp_path, {**CONFIG, "trials": 2, "report": {}})
    result = invoke(
        "run", config, "--set", "fp=0.3", "--set", "agent.kind=llm-like",
        "--set", "agent.max_steps=12", "--out", tmp_path / "results", "--jobs", 1,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (run_dir,) = run_dirs(tmp_path / "results")
    recs = records(run_dir)
    assert {r["cell_id"] for r in recs} == {"fp=0.3"}  # the grid pinned to one value
    assert len(recs) == 2 * len(MODES)
    assert all(a["steps"] <= 12 for r in recs for a in r["agents"])
    bad = invoke("run", config, "--set", "agent.kindd=gold", "--out", tmp_path / "results")
    assert bad.exit_code == 2 and "agent.kindd" in bad.stderr
    malformed = invoke("run", config, "--set", "fp", "--out", tmp_path / "results")
    assert malformed.exit_code == 2 and "KEY=VALUE" in malformed.output


def test_list(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    write_config(configs)
    everything = invoke("list", "--configs", configs)
    assert everything.exit_code == 0
    for text in ("tiny", "tx-full", "synthetic", "F3"):
        assert text in everything.stdout
    expected = {
        "configs": ["tiny", "a tiny synthetic smoke test"],
        "modes": ["tx-full", "no-tx", "atomix", "baseline"],
        "workloads": ["synthetic"],
        "faults": ["F1", "F5", "compensation"],
    }
    for kind, texts in expected.items():
        result = invoke("list", kind, "--configs", configs)
        assert result.exit_code == 0, result.output
        for text in texts:
            assert text in result.stdout, (kind, text)


def test_validate_summarises(finished: tuple[Path, Path, Any]) -> None:
    result = invoke("validate", finished[0])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "synthetic" in out and "tx-full, no-tx" in out
    assert f"{len(RATES)}: fp=0.0, fp=0.3" in out and f"{TOTAL} trials" in out


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"atomix-tx {__version__}"


@pytest.mark.parametrize("command", ["run", "sweep", "report", "compare", "list", "validate"])
def test_help_shows_an_example(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0
    assert "Example: atomix " in result.stdout


def test_resume_after_a_torn_write_completes_without_duplicates(
    finished: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    config, original, _ = finished
    run_dir = tmp_path / "tiny" / original.name
    shutil.copytree(original, run_dir)
    lines = (run_dir / "trials.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (run_dir / "trials.jsonl").write_text("".join(lines[:5]) + lines[5][:40], encoding="utf-8")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["status"] = "interrupted"
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    result = invoke("run", config, "--resume", run_dir, "--jobs", 1)
    assert result.exit_code == 0, result.output
    recs = records(run_dir)
    assert len(recs) == TOTAL
    assert without_timings(recs) == without_timings(records(original))
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "complete"
    assert f"{TOTAL - 5} trials in" in result.stdout and "5 already done" in result.stdout


def test_resume_with_other_overrides_is_refused(
    finished: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    config, original, _ = finished
    run_dir = tmp_path / "run"
    shutil.copytree(original, run_dir)
    result = invoke("run", config, "--resume", run_dir, "--trials", TRIALS + 1)
    assert result.exit_code == 2 and "another config" in result.stderr


def test_ctrl_c_keeps_trials_and_prints_the_resume_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.experiment.runner

    config = write_config(tmp_path, {**CONFIG, "report": {}})
    real = harness.experiment.runner.run_trial
    calls = {"n": 0}

    def interrupted(spec: Any) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(spec)

    monkeypatch.setattr(harness.experiment.runner, "run_trial", interrupted)
    result = invoke("run", config, "--out", tmp_path / "results", "--jobs", 1, "--seed", 5)
    assert result.exit_code == 130
    (run_dir,) = run_dirs(tmp_path / "results")
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "interrupted"
    assert len(records(run_dir)) == 3
    command = result.stderr.split("resume with:")[1].strip()
    assert command == shlex.join(
        ["atomix", "run", str(config), "--resume", str(run_dir), "--seed", "5"]
    )

    monkeypatch.setattr(harness.experiment.runner, "run_trial", real)
    resumed = invoke(*shlex.split(command)[1:], "--jobs", 1)
    assert resumed.exit_code == 0, resumed.output
    keys = [r["key"] for r in records(run_dir)]
    assert len(keys) == len(set(keys)) == TOTAL
