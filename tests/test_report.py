"""Tests of the report stack (records, table, render, report): tables, renderers and
byte-reproducible plots."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import matplotlib as mpl
import pandas as pd
import pytest
from rich.table import Table as RichTable

from harness.analysis.plots import bar_plot, line_plot
from harness.analysis.records import records_frame
from harness.analysis.render import to_csv, to_latex, to_markdown, to_rich, write_table
from harness.analysis.report import PlotSpec, write_report
from harness.analysis.table import TableSpec, build_table

# (mode, fp) -> (clean successes, n, leaks per trial pattern, wait_ms values)
CLEAN = {
    ("tx-full", 0.1): 22,
    ("tx-full", 0.3): 17,
    ("saga", 0.1): 11,
    ("saga", 0.3): 2,
    ("no-tx", 0.1): 9,
    ("no-tx", 0.3): 0,
}
N = 30


def make_records(n: int = N, calib_n: int | None = None) -> list[dict[str, Any]]:
    """Deterministic records; trial i is clean iff i < CLEAN[(mode, fp)].

    Records are emitted in a scrambled order to check that the frame sorts them.
    """
    recs: list[dict[str, Any]] = []
    cells = sorted(CLEAN)
    if calib_n is not None:
        cells += [(m, 0.0) for m in ("tx-full", "saga", "no-tx")]
    for mode, fp in cells:
        size = calib_n if fp == 0.0 else n
        k = CLEAN.get((mode, fp), size // 2)
        for i in range(size):
            recs.append(
                {
                    "key": f"tau_retail/{mode}/fp={fp}/{i}",
                    "mode": mode,
                    "cell": {"fp": fp, "fault_classes": "mixed"},
                    "cell_id": f"fp={fp}",
                    "trial": i,
                    "seed": 1000 + i,
                    "metrics": {
                        "clean": i < k,
                        "goal": True,
                        "invariant_violations": 0,
                        "leaks": 2 if (mode == "no-tx" and i % 3 == 0) else 0,
                        "wait_ms": float(i % 5) if mode == "tx-full" else 10.0,
                    },
                    "faults": [],
                    "timings": {"wall_s": 0.01},
                }
            )
    return list(reversed(recs))


@pytest.fixture
def df() -> pd.DataFrame:
    return records_frame(make_records())


CLEAN_SPEC = TableSpec(
    name="clean_success",
    metric="clean",
    kind="proportion",
    columns=("fp",),
    title="Clean task success (%)",
    row_order=("tx-full", "no-tx"),
)


# --------------------------------------------------------------------------- frame


def test_records_frame_columns_types_and_order(df: pd.DataFrame) -> None:
    assert len(df) == 6 * N
    for col in ("mode", "trial", "cell_id", "cell.fp", "cell.fault_classes", "m.clean"):
        assert col in df.columns
    assert df["m.clean"].dtype == bool
    assert df["m.goal"].dtype == bool
    assert df["m.leaks"].dtype.kind == "i"
    keys = list(zip(df["mode"], df["cell_id"], df["trial"], strict=True))
    assert keys == sorted(keys)
    assert list(df.index) == list(range(len(df)))


def test_records_frame_is_deterministic_under_input_order() -> None:
    recs = make_records()
    a = records_frame(recs)
    b = records_frame(list(reversed(recs)))
    pd.testing.assert_frame_equal(a, b)


def test_records_frame_rejects_duplicate_keys_and_bad_records() -> None:
    recs = make_records()
    with pytest.raises(ValueError, match="duplicate trial key"):
        records_frame([*recs, recs[0]])
    with pytest.raises(ValueError, match="metrics"):
        records_frame([{"mode": "x"}])


def test_records_frame_list_cell_params_are_groupable() -> None:
    rec = {"mode": "m", "cell": {"classes": ["F2", "F4"]}, "trial": 0, "metrics": {"ok": True}}
    df = records_frame([rec])
    assert df.loc[0, "cell.classes"] == '["F2", "F4"]'
    assert df.loc[0, "cell_id"] == 'classes=["F2", "F4"]'  # derived when absent


# --------------------------------------------------------------------------- tables


def test_proportion_cell_text_and_long_form(df: pd.DataFrame) -> None:
    t = build_table(df, CLEAN_SPEC)
    assert list(t.display.columns) == ["fp=0.1", "fp=0.3"]
    assert t.display.loc["tx-full", "fp=0.1"] == "73 [54, 88]"
    assert t.display.loc["no-tx", "fp=0.3"] == "0 [0, 12]"
    row = t.data[(t.data["row"] == "tx-full") & (t.data["column"] == "fp=0.1")].iloc[0]
    assert (row["n"], row["total"]) == (30, 22)
    assert row["value"] == pytest.approx(22 / 30)
    assert 100 * row["lo"] == pytest.approx(54.1, abs=0.05)
    assert 100 * row["hi"] == pytest.approx(87.7, abs=0.05)
    assert row["method"] == "clopper-pearson"
    assert row["cell.fp"] == 0.1
    assert t.n_by_cell()[("saga", "fp=0.3")] == 30


def test_row_order_respected(df: pd.DataFrame) -> None:
    t = build_table(df, CLEAN_SPEC)
    # row_order first, then the rest sorted; "absent" modes in row_order are ignored.
    assert list(t.display.index) == ["tx-full", "no-tx", "saga"]
    assert t.display.index.name == "mode"
    spec = TableSpec("x", "clean", "proportion", columns=("fp",), row_order=("ghost", "saga"))
    assert list(build_table(df, spec).display.index) == ["saga", "no-tx", "tx-full"]
    assert list(build_table(df, spec).data["row"].unique()) == ["saga", "no-tx", "tx-full"]


def test_multiple_column_params_labels(df: pd.DataFrame) -> None:
    spec = TableSpec("x", "clean", "proportion", columns=("fp", "fault_classes"))
    t = build_table(df, spec)
    assert list(t.display.columns) == ["fp=0.1,fault_classes=mixed", "fp=0.3,fault_classes=mixed"]


def test_no_columns_uses_metric_label(df: pd.DataFrame) -> None:
    one = df[df["cell.fp"] == 0.1]
    t = build_table(one, TableSpec("x", "clean", "sum"))
    assert list(t.display.columns) == ["clean"]
    n = int((one["mode"] == "tx-full").sum())
    k = int(one.loc[one["mode"] == "tx-full", "m.clean"].astype(bool).sum())
    assert t.display.loc["tx-full", "clean"] == f"{k}/{n}"


def test_columns_that_leave_cells_apart_get_the_cell_parameters(df: pd.DataFrame) -> None:
    # No column names fp, but the records hold two fp cells: a table cell never pools them.
    t = build_table(df, TableSpec("x", "clean", "sum"))
    assert t.spec.columns == ("fp",)
    assert list(t.display.columns) == ["fp=0.1", "fp=0.3"]
    by_cell = df[df["mode"] == "tx-full"].groupby("cell_id")["m.clean"].agg(["sum", "size"])
    texts = [f"{int(s)}/{int(n)}" for s, n in by_cell.itertuples(index=False)]
    assert sorted(t.display.loc["tx-full"].tolist()) == sorted(texts)


def test_missing_cell_is_na_and_reported() -> None:
    recs = [r for r in make_records() if not (r["mode"] == "saga" and r["cell"]["fp"] == 0.3)]
    t = build_table(records_frame(recs), CLEAN_SPEC)
    assert t.display.loc["saga", "fp=0.3"] == "n/a"
    row = t.data[(t.data["row"] == "saga") & (t.data["column"] == "fp=0.3")].iloc[0]
    assert row["n"] == 0 and (row["lo"], row["hi"]) == (0.0, 1.0)
    assert "n/a: no trials" in t.footer


def test_mean_kind(df: pd.DataFrame) -> None:
    spec = TableSpec("wait", "wait_ms", "mean", columns=("fp",), title="Average wait (ms)")
    t = build_table(df, spec)
    # tx-full: i % 5 over 30 trials -> mean 2.0; others constant 10.0.
    assert t.display.loc["tx-full", "fp=0.1"] == "2.00"
    assert t.display.loc["saga", "fp=0.1"] == "10.0"
    row = t.data[(t.data["row"] == "tx-full") & (t.data["column"] == "fp=0.1")].iloc[0]
    assert row["value"] == pytest.approx(2.0)
    assert row["lo"] < 2.0 < row["hi"]
    assert row["method"] == "t"
    assert "t intervals" in t.footer


def test_per_1000_kind_counts_and_bools(df: pd.DataFrame) -> None:
    t = build_table(df, TableSpec("leaks", "leaks", "per_1000", columns=("fp",)))
    # no-tx leaks 2 on every third trial: 10 trials x 2 = 20 leaks / 30 trials.
    assert t.display.loc["no-tx", "fp=0.1"] == "667"
    assert t.display.loc["tx-full", "fp=0.1"] == "0"
    row = t.data[(t.data["row"] == "tx-full") & (t.data["column"] == "fp=0.1")].iloc[0]
    assert row["method"] == "poisson-exact"
    assert row["lo"] == 0.0 and row["hi"] == pytest.approx(1000 * 3.6889 / 30, abs=0.01)
    assert "per 1,000 trials" in t.footer
    tb = build_table(df, TableSpec("unclean", "clean", "per_1000", columns=("fp",)))
    assert tb.display.loc["tx-full", "fp=0.1"] == "733"
    row = tb.data[(tb.data["row"] == "tx-full") & (tb.data["column"] == "fp=0.1")].iloc[0]
    assert row["method"] == "clopper-pearson"
    assert row["lo"] == pytest.approx(541.1, abs=0.1)


def test_sum_kind_paper_table2_style() -> None:
    recs = [
        {"key": f"{m}/{i}", "mode": m, "cell": {}, "trial": i, "metrics": {"leak": i < k}}
        for m, k in (("saga", 400), ("tx-full", 0))
        for i in range(500)
    ]
    df = records_frame(recs)
    t = build_table(df, TableSpec("leaks", "leak", "sum"))
    assert t.display.loc["saga", "leak"] == "400/500"
    p = build_table(df, TableSpec("rate", "leak", "proportion"))
    assert p.display.loc["saga", "leak"] == "80 [76, 83]"
    assert p.display.loc["tx-full", "leak"] == "0 [0, 0.7]"


def test_build_table_errors(df: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="no metric 'nope'"):
        build_table(df, TableSpec("x", "nope", "proportion"))
    with pytest.raises(ValueError, match="non-boolean"):
        build_table(df, TableSpec("x", "wait_ms", "proportion"))
    with pytest.raises(ValueError, match="cell parameter 'classes'"):
        build_table(df, TableSpec("x", "clean", "proportion", columns=("classes",)))
    with pytest.raises(ValueError, match="unknown table kind"):
        TableSpec("x", "clean", "median")
    with pytest.raises(ValueError, match="unknown interval method"):
        TableSpec("x", "clean", "proportion", method="wald")


# --------------------------------------------------------------------------- renderers


def test_markdown_states_n_and_method(df: pd.DataFrame) -> None:
    md = to_markdown(build_table(df, CLEAN_SPEC))
    lines = md.splitlines()
    assert lines[0] == "**Clean task success (%)**"
    assert "| mode | fp=0.1 | fp=0.3 |" in lines
    assert "| tx-full | 73 [54, 88] | 57 [37, 75] |" in lines
    assert "N = 30 per cell; 95% Clopper–Pearson intervals." in md


def test_markdown_states_n_per_column_when_it_varies() -> None:
    df = records_frame(make_records(n=30, calib_n=10))
    t = build_table(df, CLEAN_SPEC)
    assert t.n_text == "N = 30 per cell except 10 (fp=0.0)"
    assert t.n_text in to_markdown(t)
    assert list(t.display.columns) == ["fp=0.0", "fp=0.1", "fp=0.3"]


def test_latex_booktabs_and_escaping(df: pd.DataFrame) -> None:
    spec = TableSpec(
        "clean_success",
        "clean",
        "proportion",
        columns=("fp",),
        title="Clean 100% success & more #1 a_b",
    )
    tex = to_latex(build_table(df, spec))
    for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{tabular}{lrr}"):
        assert rule in tex
    assert r"Clean 100\% success \& more \#1 a\_b" in tex
    assert r"95\% Clopper--Pearson" in tex
    assert r"\label{tab:clean_success}" in tex
    # No unescaped specials anywhere except column separators and the \label key.
    body = "\n".join(ln for ln in tex.splitlines() if not ln.strip().startswith(r"\label"))
    body = re.sub(r"\\[%#&_$]", "", body).replace(" & ", " ")
    assert not re.search(r"[%#&_$]", body)
    assert r"tx-full & 73 [54, 88] & 57 [37, 75] \\" in tex


def test_csv_parses_back(df: pd.DataFrame) -> None:
    t = build_table(df, CLEAN_SPEC)
    text = to_csv(t)
    assert text == to_csv(build_table(df, CLEAN_SPEC))  # deterministic
    back = pd.read_csv(io.StringIO(text))
    assert len(back) == len(t.data)
    assert list(back.columns[:4]) == ["table", "metric", "kind", "confidence"]
    for col in ("n", "total", "value", "lo", "hi"):
        assert back[col].tolist() == pytest.approx(t.data[col].tolist(), rel=0, abs=0)
    assert back["text"].tolist() == t.data["text"].tolist()
    assert set(back["table"]) == {"clean_success"}


def test_rich_table(df: pd.DataFrame) -> None:
    rt = to_rich(build_table(df, CLEAN_SPEC))
    assert isinstance(rt, RichTable)
    assert rt.row_count == 3 and len(rt.columns) == 3


def test_write_table(tmp_path: Path, df: pd.DataFrame) -> None:
    paths = write_table(build_table(df, CLEAN_SPEC), tmp_path / "t")
    assert [p.name for p in paths] == ["clean_success.md", "clean_success.csv", "clean_success.tex"]
    assert all(p.read_text(encoding="utf-8") for p in paths)


# --------------------------------------------------------------------------- plots


def _bytes(paths: list[Path]) -> list[bytes]:
    return [p.read_bytes() for p in paths]


def test_plots_byte_identical_and_global_state_untouched(tmp_path: Path) -> None:
    rc_before = dict(mpl.rcParams)
    df = records_frame(make_records(n=30, calib_n=10))
    t = build_table(df, CLEAN_SPEC)
    first = bar_plot(t, tmp_path / "a" / "clean-bar") + line_plot(t, "fp", tmp_path / "a" / "line")
    # Rebuild from a fresh frame so identity does not rely on reusing objects.
    t2 = build_table(records_frame(make_records(n=30, calib_n=10)), CLEAN_SPEC)
    second = bar_plot(t2, tmp_path / "b" / "clean-bar") + line_plot(
        t2, "fp", tmp_path / "b" / "line"
    )
    assert [p.name for p in first] == ["clean-bar.png", "clean-bar.pdf", "line.png", "line.pdf"]
    assert _bytes(first) == _bytes(second)
    assert dict(mpl.rcParams) == rc_before
    png, pdf = first[0].read_bytes(), first[1].read_bytes()
    assert png.startswith(b"\x89PNG") and b"Software" not in png
    assert pdf.startswith(b"%PDF") and b"CreationDate" not in pdf and b"Matplotlib" not in pdf


def test_line_plot_requires_numeric_column_param(tmp_path: Path, df: pd.DataFrame) -> None:
    spec = TableSpec("x", "clean", "proportion", columns=("fp", "fault_classes"))
    t = build_table(df, spec)
    with pytest.raises(ValueError, match="numeric"):
        line_plot(t, "fault_classes", tmp_path / "x")
    with pytest.raises(ValueError, match="not a column"):
        line_plot(t, "mode", tmp_path / "x")
    assert len(line_plot(t, "fp", tmp_path / "ok")) == 2  # other params split lines


def test_write_report(tmp_path: Path) -> None:
    recs = make_records()
    specs = [
        CLEAN_SPEC,
        TableSpec("wait", "wait_ms", "mean", columns=("fp",)),
        TableSpec("leaks", "leaks", "per_1000", columns=("fp",)),
    ]
    plots = [
        PlotSpec("clean_success", "bar"),
        PlotSpec("clean_success", "line", x="fp", name="clean_line"),
    ]
    paths = write_report(recs, specs, tmp_path, plots)
    rel = sorted(str(p.relative_to(tmp_path)) for p in paths)
    assert rel == sorted(
        [
            f"tables/{n}.{e}"
            for n in ("clean_success", "wait", "leaks")
            for e in ("md", "csv", "tex")
        ]
        + ["tables/exercised.md", "tables/exercised.csv"]
        + [
            "plots/clean_success-bar.png",
            "plots/clean_success-bar.pdf",
            "plots/clean_line.png",
            "plots/clean_line.pdf",
        ]
    )
    again = write_report(recs, specs, tmp_path / "again", plots)
    assert _bytes(paths) == _bytes(again)
    with pytest.raises(ValueError, match="unknown tables"):
        write_report(recs, specs, tmp_path, [PlotSpec("nope", "bar")])
    with pytest.raises(ValueError, match="needs x"):
        PlotSpec("clean_success", "line")


def test_n_varying_per_cell_and_missing_metrics() -> None:
    recs = make_records()
    # Drop the metric from two saga trials: they are not counted in N for that cell.
    for r in recs:
        if r["mode"] == "saga" and r["cell"]["fp"] == 0.1 and r["trial"] < 2:
            del r["metrics"]["clean"]
    t = build_table(records_frame(recs), CLEAN_SPEC)
    assert t.n_by_cell()[("saga", "fp=0.1")] == 28
    assert t.n_text == "N = 30 per cell except 28 (saga, fp=0.1)"
    assert t.display.loc["saga", "fp=0.1"] == "32 [16, 52]"  # 9/28 (trials 0-1 were clean)
    assert t.plot_note.startswith("N = 30 per cell except 28 (saga, fp=0.1); percent with 95%")
