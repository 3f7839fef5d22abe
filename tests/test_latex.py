"""LaTeX tables: booktabs, grouped headers, a width that fits, and a real compile."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.latex import Layout, choose_layout, compile_tex, overfull_pt, table_latex
from harness.analysis.records import records_frame
from harness.analysis.table import TableSpec, build_table

HAVE_LATEX = shutil.which("pdflatex") is not None
MODES = ["tx-full", "no-frontier", "saga", "checkpoint-replay", "occ", "tcc", "mutex-wal",
         "retry-only", "no-tx", "workflow-lock", "per-call-lock"]  # fmt: skip


def _table(modes: list[str], fps: list[float], classes: list[str] | None) -> Any:
    recs = []
    for mode in modes:
        for fp in fps:
            for c in classes or [None]:
                for t in range(10):
                    cell = {"fp": fp} if c is None else {"fp": fp, "class": c}
                    recs.append({"key": f"{mode}/{fp}/{c}/{t}", "mode": mode, "cell": cell,
                                 "trial": t, "seed": 1, "metrics": {"clean": t % 3 != 0}})  # fmt: skip
    cols = ("fp",) if classes is None else ("fp", "class")
    spec = TableSpec("clean", "clean", "proportion", columns=cols, title="Clean success (%)",
                     row_order=tuple(modes))  # fmt: skip
    return build_table(records_frame(recs), spec)


def test_one_parameter_is_grouped_under_its_name() -> None:
    tex = table_latex(_table(MODES[:3], [0.0, 0.1, 0.3], None))
    assert r"\multicolumn{3}{c}{fp} \\" in tex and r"\cmidrule(lr){2-4}" in tex
    assert "mode & 0 & 0.1 & 0.3" in tex
    assert tex.startswith(r"\begin{table}[htbp]") and r"\toprule" in tex


def test_two_parameters_get_multicolumn_groups_or_row_groups() -> None:
    t = _table(MODES[:2], [0.1, 0.3], ["F1", "F2"])
    tex = table_latex(t, Layout(grouped=False, stacked=False, star=True, resize=False, width_pt=0))
    assert r"\multicolumn{2}{c}{fp = 0.1}" in tex and r"\cmidrule(lr){2-3}" in tex
    assert r"\multicolumn{2}{c}{fp = 0.3}" in tex and r"\cmidrule(lr){4-5}" in tex
    big = _table(MODES, [0.02, 0.1, 0.3], ["F1", "F2", "F3", "F4", "F5"])
    layout = choose_layout(big)
    assert layout.grouped and not layout.resize  # 15 columns become 3 row groups of 5
    tex = table_latex(big)
    assert r"\multicolumn{6}{l}{\textit{fp = 0.02}}" in tex


def test_many_modes_move_intervals_to_a_second_line_to_fit_a_column() -> None:
    layout = choose_layout(_table(MODES, [0.0, 0.1, 0.3], None))
    assert layout.stacked and not layout.star
    assert r"\scriptsize" in table_latex(_table(MODES, [0.0, 0.1, 0.3], None))


@pytest.mark.skipif(not HAVE_LATEX, reason="no pdflatex installed")
@pytest.mark.parametrize(
    "modes, fps, classes",
    [
        (MODES[:3], [0.0, 0.1, 0.3], None),
        (MODES, [0.0, 0.1, 0.3], None),
        (MODES, [0.02, 0.1, 0.3], ["F1", "F2", "F3", "F4", "F5"]),
        (MODES[:6], [0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6], None),
    ],
)
def test_compiles_without_overfull_boxes(
    tmp_path: Path, modes: list[str], fps: list[float], classes: list[str] | None
) -> None:
    tex = table_latex(_table(modes, fps, classes))
    log = compile_tex(tex, tmp_path, twocolumn=True)
    assert overfull_pt(log) == 0.0, [ln for ln in log.splitlines() if "Overfull" in ln]


def test_overfull_pt_reads_the_log() -> None:
    assert overfull_pt("Overfull \\hbox (127.3pt too wide) in paragraph") == 127.3
    assert overfull_pt("nothing") == 0.0
