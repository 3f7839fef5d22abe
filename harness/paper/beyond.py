"""Results beyond the paper, for REPRODUCTION.md: configs of ours with no paper table to
compare against (tau2 airline), reported as measured, with their paired verdicts.

Each config in `BEYOND_PAPER` is run (or its finished run reused) under the reproduction's
output directory; its section holds the tau2 data version the trials ran on, the tables its
config marks as a direction of good or harm (`better:`) and its main table, each with its
caption, then the paired verdicts against tx-full, as the run itself wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from harness.analysis.runs import load_run, write_run_report
from harness.analysis.verdicts import run_verdicts, write_verdicts
from harness.experiment.config import load_config

#: Config stem -> what the section says the config shows.
BEYOND_PAPER: dict[str, str] = {
    "tau_airline": (
        "tau2 airline under faults, every mode, the llm-like agent: the Table 6 analogue on a "
        "second domain, where bookings charge cards, cancellations refund them and "
        "certificates cannot be taken back."
    ),
    "tau_airline_stress": (
        "Several agents booking seats on one nearly full flight and adding bags to one shared "
        "reservation at once: which modes oversell seats or lose updates."
    ),
}


def _data_version(run_dir: Path) -> str:
    with open(run_dir / "trials.jsonl", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "data_version" in record:
                return str(record["data_version"])
    return "not recorded"


def _shown(run_dir: Path, out: Path) -> Path:
    """The run directory relative to the output directory, as the rest of the file names runs."""
    try:
        return run_dir.resolve().relative_to(Path(out).resolve())
    except ValueError:
        return run_dir


def beyond_paper_markdown(
    out: Path, jobs: int, configs_dir: Path, quick: bool,
    ensure_run: Callable[..., Path], say: Callable[[str], None],
) -> str:
    """The "Beyond the paper" section: each config of `BEYOND_PAPER` run under `out`."""
    parts = [
        "## Beyond the paper: tau2 airline",
        "",
        "The paper has no airline table: these results are ours alone, with nothing to be "
        "reproduced. Upstream tau2's airline data and tasks, our port of its tools (checked "
        "against upstream's own environment on every task by tests/test_upstream_tau2.py).",
        "",
    ]
    for stem, what in BEYOND_PAPER.items():
        overrides = {}
        config = load_config(configs_dir / f"{stem}.yaml")
        if quick:
            overrides = {"trials": max(20, config.trials // 5)}
            config = load_config(configs_dir / f"{stem}.yaml", overrides=overrides)
        run_dir = ensure_run(config, out, jobs, say)
        run = load_run(run_dir)
        write_run_report(run)  # the tables and verdicts `atomix run` writes
        block = run_verdicts(run)
        if block is not None:
            write_verdicts(block, run_dir / "tables")
        tables = run_dir / "tables"
        shown = [t.name for t in config.report.tables
                 if t.name == config.report.main or t.better is not None]
        parts += [
            f"### {stem}",
            "",
            f"{what} `atomix run configs/{stem}.yaml`; run `{_shown(run_dir, out)}`; "
            f"data: {_data_version(run_dir)}.",
            "",
        ]
        for name in shown:
            path = tables / f"{name}.md"
            if path.is_file():
                parts += [path.read_text(encoding="utf-8").strip(), ""]
        for path in sorted(tables.glob("verdicts-*.md")):
            parts += [path.read_text(encoding="utf-8").strip(), ""]
    return "\n".join(parts)
