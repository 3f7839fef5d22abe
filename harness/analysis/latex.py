"""LaTeX for report tables: booktabs, headers grouped by cell parameter, sized to the page.

``table_latex`` writes a ``table`` that fits ``\\columnwidth`` of a two-column paper when it
can, and a ``table*`` (``\\textwidth``) when it cannot. Widths are estimated from the text
(``estimate_width``, calibrated against pdflatex with Computer Modern); to save width it
first moves each interval onto a second line in ``\\scriptsize``, and scales the tabular
with ``\\resizebox`` only as the last resort. ``compile_tex`` runs a real pdflatex, when one
is installed, to check a table compiles and to measure overfull boxes.

pandas' Styler is not used: it needs jinja2 (not a dependency) and emits neither
``\\cmidrule`` under grouped headers nor intervals on their own line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.analysis.records import format_value, normalize
from harness.analysis.table import Table

__all__ = [
    "COLUMN_WIDTH_PT",
    "TEXT_WIDTH_PT",
    "Layout",
    "choose_layout",
    "compile_tex",
    "estimate_width",
    "latex_escape",
    "overfull_pt",
    "table_latex",
]

#: \columnwidth and \textwidth of a common two-column paper (IEEEtran / ACM: 241-252 pt and
#: 505-516 pt); we aim below the smaller of each so the table fits both.
COLUMN_WIDTH_PT = 240.0
TEXT_WIDTH_PT = 500.0
TABCOLSEP_PT = 4.0
# Average advance widths (pt) of Computer Modern characters at \small (9 pt) and
# \scriptsize (7 pt), measured with pdflatex over table-like text (digits, brackets, names).
_CHAR_PT = {"small": 4.75, "scriptsize": 3.75}


def _fmt(v: Any) -> str:
    # numpy scalars from a DataFrame would print as "np.float64(0.1)".
    return format_value(normalize(v))


_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    "–": "--",
    "—": "---",
    "×": r"\texttimes{}",  # budgets in captions (apply×8); not every TeX reads it as input
}


def latex_escape(s: str) -> str:
    """Escape LaTeX specials (``% _ & # $ { } ~ ^ \\``) and map en/em dashes to ``--``/``---``."""
    out = "".join(_LATEX_SPECIALS.get(ch, ch) for ch in s)
    # A cell starting with "[" right after "\\" would be read as its optional argument.
    return "{" + out + "}" if out.startswith("[") else out


def estimate_width(columns: Sequence[Sequence[str]], size: Sequence[str] | None = None) -> float:
    """Natural width (pt) of a tabular whose column j holds the strings ``columns[j]``.

    ``size[j]`` is "small" (default) or "scriptsize" for the widest entry's font. An
    estimate, deliberately a little generous; ``compile_tex`` gives the true figure.
    """
    total = 0.0
    for j, col in enumerate(columns):
        s = (size or ["small"] * len(columns))[j]
        total += max((len(c) for c in col), default=0) * _CHAR_PT[s] + 2 * TABCOLSEP_PT
    return total


@dataclass(frozen=True)
class Layout:
    """How a table is set: outer parameters as row ``grouped`` (else all in the header),
    ``stacked`` intervals, ``star`` (table*), ``resize`` to width as the last resort."""

    grouped: bool
    stacked: bool
    star: bool
    resize: bool
    width_pt: float


def _split_cell(text: str) -> tuple[str, str]:
    """ "73 [54, 88]" -> ("73", "[54, 88]"); text without an interval -> (text, "")."""
    m = re.fullmatch(r"(.*?)\s*(\[[^\]]*\])", text)
    return (m.group(1), m.group(2)) if m else (text, "")


@dataclass(frozen=True)
class _Grid:
    """A table laid out for LaTeX: header levels, then row groups of (label, cell texts)."""

    levels: list[tuple[str, list[tuple[str, int]]]]  # (param, [(value text, span)]) outer->inner
    groups: list[tuple[str, list[tuple[str, list[str]]]]]  # ("" = no group title, rows)
    corner: str


def _grid(table: Table, grouped: bool) -> _Grid:
    spec = table.spec
    corner = str(table.display.index.name)
    labels = [str(r) for r in table.display.index]
    if not spec.columns:
        rows = [(lab, [_short(str(v)) for v in r]) for lab, r in
                zip(labels, table.display.itertuples(index=False), strict=True)]  # fmt: skip
        return _Grid([(spec.metric, [])], [("", rows)], corner)
    data = table.data
    params = list(spec.columns)
    text = {
        (str(r), tuple(_fmt(v) for v in vals)): _short(str(t))
        for r, t, *vals in zip(
            data["row"], data["text"], *(data[f"cell.{p}"] for p in params), strict=True
        )
    }
    first = data.drop_duplicates("column").set_index("column")
    # Column combinations in display order (numbers numerically, as build_table sorts).
    combos = [tuple(_fmt(first.loc[c, f"cell.{p}"]) for p in params) for c in table.display.columns]
    head_params = params[-1:] if grouped else params
    outer = list(dict.fromkeys(c[: len(params) - len(head_params)] for c in combos))
    heads = list(dict.fromkeys(c[len(params) - len(head_params) :] for c in combos))
    levels: list[tuple[str, list[tuple[str, int]]]] = []
    for level, param in enumerate(head_params):
        spans: list[tuple[str, int]] = []
        prev: tuple[str, ...] | None = None
        for h in heads:
            if level < len(head_params) - 1 and prev == h[: level + 1]:
                spans[-1] = (spans[-1][0], spans[-1][1] + 1)
            else:
                spans.append((h[level], 1))
            prev = h[: level + 1]
        levels.append((param, spans))
    groups = []
    for o in outer:
        title = ", ".join(f"{p} = {v}" for p, v in zip(params, o, strict=False))
        rows = [(lab, [text.get((lab, (*o, *h)), "n/a") for h in heads]) for lab in labels]
        groups.append((title, rows))
    return _Grid(levels, groups, corner)


def _short(text: str) -> str:
    """Cell text for LaTeX. "n/a (not exercised)" stays spelt out, as in every other output:
    a reader who skips the caption must not take an abbreviation for a result; the layout
    pays for its width (a wider table, or table*)."""
    return text


def _width(grid: _Grid, stacked: bool) -> float:
    rows = [r for _, g in grid.groups for r in g]
    label_col = [grid.corner, *(lab for lab, _ in rows)]
    width = estimate_width([label_col])
    ncols = len(rows[0][1]) if rows else 0
    heads = [v for v, _ in grid.levels[-1][1]] if grid.levels[-1][1] else [grid.levels[-1][0]]
    for j in range(ncols):
        cells = [r[1][j] for r in rows]
        if stacked:
            parts = [_split_cell(c) for c in cells]
            width += max(
                estimate_width([[p[0] for p in parts] + [heads[j]]]),
                estimate_width([[p[1] for p in parts]], ["scriptsize"]),
            )
        else:
            width += estimate_width([cells + [heads[j]]])
    # Group titles span the whole row; a long one can widen the table too.
    titles = [t for t, _ in grid.groups if t]
    return max(width, estimate_width([titles]) if titles else 0.0)


def choose_layout(table: Table) -> Layout:
    """The first layout that fits ``\\columnwidth``, else ``\\textwidth``: all parameters
    in the header on one line, outer parameters as row groups, then intervals on a second
    line; when nothing fits the page, row groups with stacked intervals scaled down."""
    multi = len(table.spec.columns) >= 2
    has_ci = any(_split_cell(str(t))[1] for t in table.data["text"])
    options = [(g, s) for s in (False, True) for g in (False, True)
               if (multi or not g) and (has_ci or not s)]  # fmt: skip
    for star, limit in ((False, COLUMN_WIDTH_PT), (True, TEXT_WIDTH_PT)):
        for grouped, stacked in options:
            w = _width(_grid(table, grouped), stacked)
            if w <= limit:
                return Layout(grouped, stacked, star, False, w)
    grouped, stacked = multi, has_ci
    return Layout(grouped, stacked, True, True, _width(_grid(table, grouped), stacked))


def table_latex(table: Table, layout: Layout | None = None) -> str:
    """A booktabs table with grouped ``\\multicolumn`` headers (``\\cmidrule`` under each
    group), a caption stating N and the interval method, and a size chosen to fit (see
    ``choose_layout``; ``layout`` forces one). Guarantees: every text is escaped; the same
    table gives the same bytes."""
    esc = latex_escape
    layout = layout or choose_layout(table)
    grid = _grid(table, layout.grouped)
    title = table.title.rstrip(".")
    footer = table.footer
    caption = esc(f"{title}. {footer}")
    label = re.sub(r"[^A-Za-z0-9:._-]", "-", table.spec.name)
    env = "table*" if layout.star else "table"
    width = r"\textwidth" if layout.star else r"\columnwidth"
    ncols = len(grid.groups[0][1][0][1]) if grid.groups and grid.groups[0][1] else 0
    lines = [
        f"\\begin{{{env}}}[htbp]",
        r"  \centering",
        r"  \small",
        f"  \\setlength{{\\tabcolsep}}{{{TABCOLSEP_PT:g}pt}}",
        f"  \\caption{{{caption}}}",
        f"  \\label{{tab:{label}}}",
    ]
    if layout.resize:
        # Last resort: wider than the page even with row groups and stacked intervals.
        lines.append(f"  \\resizebox{{{width}}}{{!}}{{%")
    lines += [f"  \\begin{{tabular}}{{l{'r' * ncols}}}", r"    \toprule"]
    for i, (param, spans) in enumerate(grid.levels):
        if not spans:  # no column parameters: one column named by the metric
            lines.append(f"    {esc(grid.corner)} & {esc(param)} \\\\")
            continue
        if i == len(grid.levels) - 1:
            if len(grid.levels) == 1:  # name the parameter above its values
                lines.append(f"     & \\multicolumn{{{ncols}}}{{c}}{{{esc(param)}}} \\\\")
                lines.append(f"    \\cmidrule(lr){{2-{ncols + 1}}}")
            cells = [esc(v) for v, _ in spans]
            lines.append(f"    {esc(grid.corner)} & " + " & ".join(cells) + r" \\")
            continue
        cells, rules, col = [], [], 2
        for v, span in spans:
            cells.append(f"\\multicolumn{{{span}}}{{c}}{{{esc(f'{param} = {v}')}}}")
            rules.append(f"\\cmidrule(lr){{{col}-{col + span - 1}}}")
            col += span
        lines.append("     & " + " & ".join(cells) + r" \\")
        lines.append("    " + " ".join(rules))
    for title_text, rows in grid.groups:
        lines.append(r"    \midrule")
        if title_text:
            lines.append(
                f"    \\multicolumn{{{ncols + 1}}}{{l}}{{\\textit{{{esc(title_text)}}}}} \\\\"
            )
        for row_label, cells in rows:
            if not layout.stacked:
                lines.append("    " + " & ".join(esc(c) for c in [row_label, *cells]) + r" \\")
                continue
            parts = [_split_cell(c) for c in cells]
            lines.append(
                "    " + " & ".join([esc(row_label), *(esc(v) for v, _ in parts)]) + r" \\"
            )
            ci = [f"{{\\scriptsize {esc(c)}}}" if c else "" for _, c in parts]
            lines.append("    " + " & ".join(["", *ci]) + r" \\[1pt]")
    lines += [r"    \bottomrule", r"  \end{tabular}"]
    if layout.resize:
        lines.append(r"  }")
    lines += [f"\\end{{{env}}}", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- real LaTeX

_PREAMBLE = r"""\documentclass[10pt{twocol}]{{article}}
\usepackage[letterpaper,margin=0.75in,columnsep=0.25in]{{geometry}}
\usepackage[T1]{{fontenc}}
\usepackage{{booktabs}}
\usepackage{{graphicx}}
\begin{{document}}
\hbadness=10000
{body}
\end{{document}}
"""


def compile_tex(tex: str, workdir: Path, twocolumn: bool = True) -> str:
    """Compile ``tex`` (a table environment) in a test document with pdflatex; return the
    log. The two-column page has \\textwidth 506 pt and \\columnwidth 244 pt (letter, 0.75 in margins).
    Raises RuntimeError with the log's error lines if pdflatex fails, FileNotFoundError if
    it is not installed."""
    exe = shutil.which("pdflatex")
    if exe is None:
        raise FileNotFoundError("pdflatex is not installed")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    doc = _PREAMBLE.format(twocol=",twocolumn" if twocolumn else "", body=tex)
    (workdir / "t.tex").write_text(doc, encoding="utf-8")
    proc = subprocess.run(
        [exe, "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = (workdir / "t.log").read_text(encoding="latin-1") if (workdir / "t.log").exists() else ""
    if proc.returncode != 0:
        errors = [ln for ln in log.splitlines() if ln.startswith("!")]
        raise RuntimeError("pdflatex failed: " + "; ".join(errors or [proc.stdout[-500:]]))
    return log


def overfull_pt(log: str) -> float:
    """The largest ``Overfull \\hbox (X pt too wide)`` in a LaTeX log, 0.0 when none."""
    found = [float(x) for x in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    return max(found, default=0.0)
