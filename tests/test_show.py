"""`atomix show RUN [TRIAL]`: a trial's timeline, replayed from the run's own config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import TOTAL, invoke, run_dirs, write_config


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("show")
    result = invoke("run", write_config(tmp), "--out", tmp / "out", "--jobs", "1")
    assert result.exit_code == 0, result.output
    (found,) = run_dirs(tmp / "out")
    return found


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "trials.jsonl").read_text().splitlines()]


def test_without_a_trial_it_lists_the_run(run_dir: Path) -> None:
    result = invoke("show", run_dir)
    assert result.exit_code == 0
    assert f"{TOTAL} trial(s)" in result.output
    assert _records(run_dir)[0]["key"] in result.output


def test_a_faulty_trial_shows_its_calls_faults_and_settlement_and_replays_identically(
    run_dir: Path,
) -> None:
    records = _records(run_dir)
    n, record = next((i, r) for i, r in enumerate(records, 1) if r["faults"])
    result = invoke("show", run_dir, n)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"trial {record['key']}" in out
    assert out.count("!! ") == len(record["faults"])  # every injected fault is on the timeline
    assert all(f"!! {f['fault']} injected" in out for f in record["faults"])
    assert "settlement per agent:" in out and "replay: identical to the stored record" in out
    by_key = invoke("show", run_dir, record["key"])
    assert by_key.output == out
    tail = record["key"].split("/", 1)[1]  # mode/cell/trial: a whole tail of one key
    assert invoke("show", run_dir, tail).output == out


def test_a_tampered_record_is_reported_as_not_reproduced(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "manifest.json").write_text((run_dir / "manifest.json").read_text())
    records = _records(run_dir)
    records[0]["metrics"]["clean"] = not records[0]["metrics"]["clean"]
    (copy / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = invoke("show", copy, 1)
    assert result.exit_code == 0
    assert "replay DIFFERS from the stored record in: metrics" in result.output


@pytest.mark.parametrize(
    ("selector", "message"),
    [("0", "the run has trials 1.."), ("no-such-key", "no trial's key contains"), ("tiny", "say more")],
)
def test_bad_selectors_get_one_clear_error(run_dir: Path, selector: str, message: str) -> None:
    result = invoke("show", run_dir, selector)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_a_directory_that_is_not_a_run_is_refused(tmp_path: Path) -> None:
    result = invoke("show", tmp_path)
    assert result.exit_code == 2 and "not a run directory" in result.output
    assert "holds no runs" in result.output
