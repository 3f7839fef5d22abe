"""Plots that cannot mislead: unique styles, facets, legend outside, TrueType fonts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib as mpl
import pytest

from harness.analysis import plots
from harness.analysis.records import records_frame
from harness.analysis.table import TableSpec, build_table


def _records(modes: list[str], fps: list[float], classes: list[str], n: int = 6) -> list[dict]:
    recs: list[dict[str, Any]] = []
    for m_i, mode in enumerate(modes):
        for fp in fps:
            for c in classes:
                for t in range(n):
                    recs.append(
                        {
                            "key": f"x/{mode}/{fp}/{c}/{t}",
                            "mode": mode,
                            "cell": {"fp": fp, "class": c},
                            "cell_id": f"fp={fp}, class={c}",
                            "trial": t,
                            "seed": 1,
                            "metrics": {"clean": (t + m_i) % 3 != 0, "leaks": t % 2},
                        }
                    )
    return recs


MODES = [f"mode-{i}" for i in range(11)]


@pytest.mark.parametrize("n", [1, 8, 11, 20])
def test_every_mode_gets_its_own_colour_and_marker(n: int) -> None:
    styles = plots.mode_styles([f"m{i}" for i in range(n)])
    assert len({s.color for s in styles.values()}) == n
    assert len({s.marker for s in styles.values()}) == min(n, len(plots.MARKERS))


def test_styles_stay_distinct_past_the_palette() -> None:
    styles = plots.mode_styles([f"m{i}" for i in range(60)])
    pairs = {(s.color, s.marker, s.linestyle) for s in styles.values()}
    assert len(pairs) == 60


def _table(spec: TableSpec, modes: list[str] = MODES) -> Any:
    recs = _records(modes, [0.02, 0.1, 0.3], ["F1", "F2"])
    return build_table(records_frame(recs), spec)


def test_line_plot_facets_per_class_with_truetype_fonts(tmp_path: Path) -> None:
    spec = TableSpec("clean", "clean", "proportion", columns=("fp", "class"), title="Clean")
    rc_before = dict(mpl.rcParams)
    png, pdf = plots.line_plot(_table(spec), "fp", tmp_path / "line")
    assert dict(mpl.rcParams) == rc_before
    data = pdf.read_bytes()
    assert b"/Type3" not in data and b"/FontType 3" not in data
    assert b"/TrueType" in data or b"/CIDFontType2" in data
    assert png.read_bytes().startswith(b"\x89PNG")


def test_layout_legend_outside_axes_and_title_uncovered(tmp_path: Path, monkeypatch) -> None:
    spec = TableSpec("clean", "clean", "proportion", columns=("fp", "class"), title="Clean")
    seen: dict[str, Any] = {}
    real_finish = plots._finish

    def spy(fig, axes, table, out_stem):  # type: ignore[no-untyped-def]
        paths = real_finish(fig, axes, table, out_stem)
        renderer = fig.canvas.get_renderer()
        seen["axes"] = [ax.get_window_extent(renderer) for ax in axes]
        seen["legend"] = fig.legends[0].get_window_extent(renderer)
        seen["texts"] = {t.get_text(): t.get_window_extent(renderer) for t in fig.texts}
        seen["labels"] = [t.get_text() for t in fig.legends[0].get_texts()]
        return paths

    monkeypatch.setattr(plots, "_finish", spy)
    plots.line_plot(_table(spec), "fp", tmp_path / "line")
    assert len(seen["axes"]) == 2  # one panel per class
    assert sorted(seen["labels"]) == sorted(MODES)  # one entry per mode, not per (mode, class)
    legend = seen["legend"]
    for box in seen["axes"]:
        assert not legend.overlaps(box)
    title = seen["texts"]["Clean"]
    assert not title.overlaps(legend)
    assert all(not title.overlaps(b) for b in seen["axes"])
    notes = [b for t, b in seen["texts"].items() if t.startswith("N =")]
    assert notes and not notes[0].overlaps(legend)


def test_bar_plot_panels_and_bytes_reproducible(tmp_path: Path) -> None:
    spec = TableSpec("leaks", "leaks", "per_1000", columns=("class", "fp"))
    a = plots.bar_plot(_table(spec), tmp_path / "a" / "bar")
    b = plots.bar_plot(_table(spec), tmp_path / "b" / "bar")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert b"/Type3" not in a[1].read_bytes()


def test_doubling_sweep_uses_a_log_axis(tmp_path: Path, monkeypatch) -> None:
    recs = []
    for mode in ("tx-full", "workflow-lock"):
        for n in (2, 4, 8, 16, 32, 64):
            for t in range(3):
                recs.append({"key": f"{mode}/{n}/{t}", "mode": mode, "cell": {"n": n},
                             "cell_id": f"n={n}", "trial": t, "seed": 1,
                             "metrics": {"wait_ms": float(n * t)}})  # fmt: skip
    spec = TableSpec("wait", "wait_ms", "mean", columns=("n",))
    scales = []
    real_finish = plots._finish

    def spy(fig, axes, table, out_stem):  # type: ignore[no-untyped-def]
        scales.extend(ax.get_xscale() for ax in axes)
        return real_finish(fig, axes, table, out_stem)

    monkeypatch.setattr(plots, "_finish", spy)
    plots.line_plot(build_table(records_frame(recs), spec), "n", tmp_path / "w")
    assert scales == ["log"]
