"""The trial record has one definition (harness.experiment.record): the committed JSON Schema
is generated from it, and the records a real run writes satisfy it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from harness.experiment.config import load_config
from harness.experiment.record import TrialRecord, json_schema
from harness.experiment.runner import read_records, run

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "docs" / "trial-record.schema.json"


def test_the_committed_schema_is_generated_from_the_types() -> None:
    committed = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert committed == json.loads(json.dumps(json_schema())), (
        "docs/trial-record.schema.json is stale: run python -m harness.experiment.record"
    )


def test_records_of_a_real_run_satisfy_the_schema(tmp_path: Path) -> None:
    config = load_config(ROOT / "configs" / "tau_retail.yaml", overrides={"trials": 2})
    result = run(config, out=tmp_path, jobs=1)
    records = read_records(result.records_path)
    assert len(records) == 2 * len(config.modes) * 3  # the three fault-rate cells
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    for record in records:
        errors = [e.message for e in validator.iter_errors(record)]
        assert not errors, (record["key"], errors[:3])
        # Every required field, and no field the record type does not know; optional ones
        # (a retry's provenance, a reward) only where they apply.
        optional = {k for k, v in TrialRecord.__annotations__.items()
                    if "NotRequired[" in str(v)}
        assert set(TrialRecord.__annotations__) - optional <= set(record)
        assert set(record) <= set(TrialRecord.__annotations__)
        assert "retry" not in record  # only a retried trial says it was one


def test_the_schema_refuses_a_record_without_its_verdict() -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    assert not validator.is_valid({"key": "x"})
