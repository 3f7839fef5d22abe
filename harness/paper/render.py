"""REPRODUCTION.md: the paper's cells beside ours, with a verdict for each.

``render`` turns judged sections into the file's text (header, rules, runs, summary, then
each table with its variants); ``write_reproduction`` writes it atomically. The text is a
function of its inputs, apart from the revision, the date and the time taken.
"""

from __future__ import annotations

import datetime as _dt
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.experiment.config import ExperimentConfig
from harness.experiment.paper_cells import tables
from harness.paper.judge import (
    DIFFERS,
    NO_CONFIG,
    NOT_COMPARABLE,
    REPRODUCED,
    RULE,
    UNEXPLAINED,
    Line,
    Note,
    Section,
)
from harness.paper.mapping import QUICK_FLOOR
from harness.paper.timing import TIMING_RULE

__all__ = [
    "REPORT_NAME",
    "render",
    "revision",
    "write_reproduction",
]

#: The file written under the output directory.
REPORT_NAME = "REPRODUCTION.md"


def revision() -> str:
    """`git describe` and the commit of the checkout, or "unknown"."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], capture_output=True, text=True, timeout=5, cwd=here
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() or None if out.returncode == 0 else None

    described = git("describe", "--always", "--dirty", "--tags")
    commit = git("rev-parse", "HEAD")
    if commit is None:
        return "unknown"
    return f"{described} ({commit})" if described and not commit.startswith(described) else commit


def _md(text: str) -> str:
    # A pipe would end the table cell, a newline the row.
    return text.replace("|", r"\|").replace("\n", " ")


def _row_label(line: Line, repeats: Mapping[str, int]) -> str:
    # A row label the paper repeats (Table 16) is told apart by its position.
    if repeats.get(line.row, 1) > 1:
        return f"{line.row} ({line.occurrence + 1} of {repeats[line.row]})"
    return line.row


def _section_markdown(section: Section) -> list[str]:
    """One table's comparison: the counts line, the table and the notes as footnotes."""
    repeats: dict[str, int] = {}
    for line in section.lines:
        repeats[line.row] = max(repeats.get(line.row, 0), line.occurrence + 1)
    out: list[str] = []
    counts = section.counts()
    out.append(
        f"Configs: {', '.join(f'`{n}`' for n in section.configs) or 'none'}. "
        f"Reproduced {counts[REPRODUCED]}, differs {counts[DIFFERS]}"
        f"{f' ({counts[UNEXPLAINED]} {UNEXPLAINED})' if counts[UNEXPLAINED] else ''}, "
        f"not comparable {counts[NOT_COMPARABLE]}."
    )
    out += [
        "",
        f"| paper row | paper column | paper | ours [{section.interval}] | our mode, cell "
        "| N paper / ours | verdict |",
    ]
    out.append("| :--- | :--- | ---: | ---: | :--- | ---: | :--- |")
    footnotes: list[Note] = []
    for line in section.lines:
        verdict = line.verdict.kind
        if line.verdict.kind == DIFFERS:
            if line.note is None:
                verdict += f" — **{UNEXPLAINED}** ({line.verdict.reason})"
            else:
                if line.note not in footnotes:
                    footnotes.append(line.note)
                verdict += f" [{footnotes.index(line.note) + 1}] ({line.verdict.reason})"
        elif line.verdict.kind == NOT_COMPARABLE:
            verdict += f": {line.verdict.reason}"
        n = f"{line.paper_n} / {line.ours_n or '—'}"
        out.append(
            "| "
            + " | ".join(
                _md(x)
                for x in (
                    _row_label(line, repeats),
                    line.column,
                    line.paper,
                    line.ours,
                    line.where or "—",
                    n,
                    verdict,
                )
            )
            + " |"
        )
    out.append("")
    for i, note in enumerate(footnotes, 1):
        out += [f"[{i}] {note.why}", ""]
    return out


def render(
    sections: Sequence[Section],
    runs: Mapping[str, tuple[Path, ExperimentConfig]],
    *,
    command: str,
    quick: bool,
    out: Path,
    wall_s: float,
    cpu_s: float,
    when: str | None = None,
    rev: str | None = None,
    not_run: Mapping[str, str] | None = None,
    benchmarks: Mapping[str, str] | None = None,
    appendix: Sequence[str] = (),
) -> str:
    """REPRODUCTION.md: header, rule, summary, then each table in order with its variants,
    then the `appendix` sections (Markdown, each with its own heading).
    `benchmarks`: name -> what was measured where (listed under Runs)."""
    when = when or _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    mode = (
        f"quick (N per cell and mode = a fifth of each config's trials, at least {QUICK_FLOOR}, "
        "at most the config's own)"
        if quick
        else "full (each config's own N, the paper's where the config follows it)"
    )
    captions = tables()
    lines = [
        "# Reproduction of the paper's result tables",
        "",
        f"- Revision: {rev or revision()}",
        f"- Date: {when}",
        f"- Command: `{command}`",
        f"- Mode: {mode}",
        f"- Time: {wall_s:.0f} s wall, {cpu_s:.0f} s CPU (this process and its workers) for "
        "this invocation; finished runs under the output directory are reused, not re-run",
        "",
        "Generated by `atomix reproduce` from `harness/experiment/paper_cells.csv` (the paper's cells), "
        "each config's `paper:` section (the mapping), the runs' trial records and "
        "`harness/paper/paper_notes.yaml` (the explanations). Do not edit by hand.",
        "",
        "## Verdict rule",
        "",
        RULE,
        "",
        TIMING_RULE,
        "",
        "## Runs",
        "",
        "| config | run | N per cell and mode |",
        "| :--- | :--- | ---: |",
    ]
    for name, (run_dir, config) in sorted(runs.items()):
        base = out.resolve()  # runs are listed relative to the output directory
        shown = (
            run_dir.resolve().relative_to(base)
            if run_dir.resolve().is_relative_to(base)
            else run_dir
        )
        lines.append(f"| `{name}` | `{shown}` | {config.trials} |")
    for name, why in sorted((not_run or {}).items()):
        lines.append(f"| `{name}` | not run: {_md(why)} | — |")
    for name, what in sorted((benchmarks or {}).items()):
        lines.append(f"| `{name}` (benchmark) | {_md(what)} | see the table |")
    if not runs and not not_run and not benchmarks:
        lines.append("| — | — | — |")
    lines += [
        "",
        "## Summary",
        "",
        "Counts of judged cells (a value with its interval or count is one cell).",
        "",
        "| table | configs | reproduced | differs | of which unexplained | not comparable |",
        "| :--- | :--- | ---: | ---: | ---: | ---: |",
    ]
    for s in sections:
        c = s.counts()
        label = f"{s.table}" if not s.variant else f"{s.table} (variant)"
        configs = ", ".join(f"`{n}`" for n in s.configs) or NO_CONFIG
        lines.append(
            f"| {label} | {configs} | {c[REPRODUCED]} | {c[DIFFERS]} | {c[UNEXPLAINED]} | "
            f"{c[NOT_COMPARABLE]} |"
        )
    lines.append("")
    for s in sections:
        if s.variant:
            lines += [
                f"### Table {s.table}, labelled variant: `{', '.join(s.configs)}`",
                "",
                f"Not the reproduction of Table {s.table}: {_md(s.variant)}",
                "",
            ]
        else:
            lines += [f"## Table {s.table}", "", f"> {captions[s.table]}", ""]
        lines += _section_markdown(s)
    for block in appendix:
        lines += ["", block.rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def write_reproduction(out: Path, text: str) -> Path:
    """Write `text` as `out/REPRODUCTION.md`, atomically (a reader never sees half a file)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_NAME
    tmp = path.with_name(f".{REPORT_NAME}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
