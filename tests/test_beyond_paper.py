"""REPRODUCTION.md's results beyond the paper: the airline configs, run under the output
directory, reported with their data version, tables and paired verdicts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.paper.beyond import BEYOND_PAPER, beyond_paper_markdown
from harness.paper.reproduce import ensure_run

ROOT = Path(__file__).resolve().parents[1]


def test_the_airline_section_names_its_data_and_shows_its_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a relative output directory, as `atomix reproduce` is given
    text = beyond_paper_markdown(Path("out"), 1, ROOT / "configs", True, ensure_run,
                                 lambda _: None)
    assert "The paper has no airline table" in text
    for stem in BEYOND_PAPER:
        assert f"### {stem}" in text
    assert text.count("data: tau2-bench 1.0 airline tasks") == len(BEYOND_PAPER)
    assert "**Clean task success on tau2 airline (%)**" in text
    assert "n/a (not exercised)" in text  # no 1.0 task sends a certificate
    assert "each mode minus tx-full on paired trials" in text
    assert not any(os.path.isabs(p) for p in text.split("`") if p.startswith("/"))
