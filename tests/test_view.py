"""`atomix view` without a browser: the data it reads, the diff, the alignment, the command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from starlette.testclient import TestClient
from typer.testing import CliRunner

from cli import app
from harness.view.app import create_app
from harness.view.data import ResultsIndex, filter_rows
from harness.view.timeline import align
from harness.world.statediff import diff_states

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "view_llm_run"


def test_diff_states_names_each_differing_leaf() -> None:
    gold = {"orders": {"#W1": {"status": "cancelled", "items": [1, 2]}}, "mail": []}
    final = {"orders": {"#W1": {"status": "pending", "items": [1, 3]}}, "mail": []}
    assert diff_states(gold, final) == [
        {"path": "orders.#W1.items[1]", "gold": 2, "final": 3},
        {"path": "orders.#W1.status", "gold": "cancelled", "final": "pending"},
    ]
    assert diff_states(gold, gold) == []
    many = diff_states({str(i): i for i in range(50)}, {str(i): -i - 1 for i in range(50)}, limit=5)
    assert many[-1] == {"path": "...", "more": 45} and len(many) == 6


def test_trial_index_reads_only_what_a_live_run_appended(tmp_path: Path) -> None:
    run = tmp_path / "tau_retail_llm" / "r1"
    shutil.copytree(FIXTURE, run)
    lines = (run / "trials.jsonl").read_bytes().splitlines(keepends=True)
    (run / "trials.jsonl").write_bytes(b"".join(lines[:2]))
    index = ResultsIndex(tmp_path)
    run_id = index.run_id(run)
    assert len(index.trials(run_id).rows) == 2
    with (run / "trials.jsonl").open("ab") as fh:
        fh.write(lines[2])
        fh.write(lines[3][:40])  # a line still being written is left for later
    assert len(index.trials(run_id).rows) == 3
    with (run / "trials.jsonl").open("ab") as fh:
        fh.write(lines[3][40:])
    rows = index.trials(run_id).rows
    assert [r.line for r in rows] == [1, 2, 3, 4]
    assert filter_rows(rows, outcome="clean") == [r for r in rows if r.clean]
    assert all(r.mode == "no-tx" for r in filter_rows(rows, mode="no-tx"))
    record = index.trials(run_id).record(rows[3].key)
    assert record["key"] == rows[3].key


def test_trial_index_keeps_each_record_parsed_once_in_step_with_its_rows(tmp_path: Path) -> None:
    runs = []
    for name in ("r1", "r2"):
        runs.append(tmp_path / "tau_retail_llm" / name)
        shutil.copytree(FIXTURE, runs[-1])
    lines = (runs[0] / "trials.jsonl").read_bytes().splitlines(keepends=True)
    # A damaged line and a repeated key are left out of the rows and of the records alike.
    (runs[0] / "trials.jsonl").write_bytes(lines[0] + b"{not json\n" + lines[1] + lines[0])
    index = ResultsIndex(tmp_path)
    index.KEEP_RECORDS = 1
    first, second = (index.run_id(r) for r in runs)
    trials = index.trials(first)
    assert trials.damaged == 1 and [r.key for r in trials.rows] == [
        json.loads(line)["key"] for line in lines[:2]]
    assert trials.records() == [json.loads(line) for line in lines[:2]]
    with (runs[0] / "trials.jsonl").open("ab") as fh:
        fh.write(lines[2])
    _, version, records = index.snapshot(first)
    assert version == trials.version and records == [json.loads(line) for line in lines[:3]]
    # Reading a second run lets the first's records go (one run keeps them); its rows stay,
    # and its records are parsed again, the same, when asked for.
    index.snapshot(second)
    assert not trials.holds_records and len(trials.rows) == 3
    assert index.trials(second).holds_records
    assert trials.records() == records
    trials.drop_records()
    with (runs[0] / "trials.jsonl").open("ab") as fh:
        fh.write(lines[3])
    assert index.trials(first).records() == [json.loads(line) for line in lines[:4]]


def test_align_marks_the_first_divergence() -> None:
    def call(op: str, err: str | None = None) -> dict:
        return {"kind": "call", "agent": "a0", "op": op, "tool": "t", "args": {},
                "error": {"kind": err, "message": ""} if err else None, "faults": []}

    same = align([call("1"), call("2")], [call("1"), call("2")])
    assert same.first_divergence is None and all(s for _, _, s in same.rows)
    parted = align([call("1"), call("2", "error"), call("3")], [call("1"), call("2"), call("3")])
    assert parted.first_divergence == 1
    extra = align([call("1"), call("2")], [call("1"), call("9"), call("2")])
    assert extra.first_divergence == 1 and extra.rows[1][0] is None


def test_pages_answer_and_refuse_what_they_cannot_show(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "tau_retail_llm" / "r1")
    client = TestClient(create_app(tmp_path, prefetch=False))
    assert "tau_retail_llm" in client.get("/").text
    page = client.get("/trials", params={"run": "tau_retail_llm/r1", "mode": "tx-full"})
    assert page.status_code == 200 and "of 4 trials match" in page.text
    key = json.loads((FIXTURE / "trials.jsonl").read_text().splitlines()[0])["key"]
    trial = client.get("/trial", params={"run": "tau_retail_llm/r1", "key": key})
    assert trial.status_code == 200 and "Conversation" in trial.text
    assert client.get("/trials", params={"run": "../etc"}).status_code == 404
    bad = client.get("/trials", params={"run": "tau_retail_llm/r1", "outcome": "sad"})
    assert bad.status_code == 404 and "allowed: clean" in bad.text
    assert client.get("/vendor/htmx.min.js").status_code == 200
    assert client.get("/vendor/plotly.min.js").status_code == 200


def test_view_command_refuses_a_missing_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["view", str(tmp_path / "nope"), "--no-browser"])
    assert result.exit_code == 2
    assert "no such directory" in result.output
