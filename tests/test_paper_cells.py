"""The paper's cells as data (harness/experiment/paper_cells.csv), checked against the paper's text.

Structural tests read only the repository. Text-matching tests need the paper's text
extraction next to the checkout and are skipped without it (CI clones only the repository):
they check every caption and every value against the paper itself, so a typed-in number
cannot drift from it.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path

import pytest

from harness.experiment.paper_cells import CELLS_PATH, PaperCell, load_cells, parse_number, tables

PAPER = Path(__file__).resolve().parents[2] / "shared" / "paper" / "atomix-paper.txt"
RESULT_TABLES = {1, 2, 3, *range(5, 22)}
FIELDS = ["table", "row", "column", "value", "n", "caption"]

# A number as printed: thousands commas, decimals, an optional sign and percent sign.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?")
_CAPTION = re.compile(r"^Table (\d+):", re.M)
_LATEX = {
    r"\tau": "τ",
    r"\approx": "≈",
    r"\in": "∈",
    r"\mu": "μ",
    r"\pm": "±",
    r"\sim": "~",
    r"\Delta": "Δ",
}


def _raw_rows() -> list[dict[str, str]]:
    with CELLS_PATH.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == FIELDS
        return list(reader)


def _delatex(text: str) -> str:
    for cmd, char in _LATEX.items():
        text = text.replace(cmd, char)
    return re.sub(r"[${}\\]", "", text)


def _squash(text: str) -> str:
    """LaTeX rendered, then every whitespace run removed (captions wrap over lines)."""
    return re.sub(r"\s+", "", _delatex(text))


def _paper_text() -> str:
    if not PAPER.is_file():
        pytest.skip(f"paper text not available at {PAPER} (CI clones only the repository)")
    return PAPER.read_text(encoding="utf-8")


def _blocks(text: str) -> dict[int, tuple[list[str], str]]:
    """Table number -> (body lines, block text) from the paper.

    The block runs from the previous caption to the next one, so it holds the caption and the
    body whichever side of the caption the body is printed. The body lines are the
    tab-separated lines between the previous caption and this one (the extraction prints a
    body above its caption), or, when there are none, those between this caption and the next.
    """
    starts = [m.start() for m in _CAPTION.finditer(text)] + [len(text)]
    nums = [int(m.group(1)) for m in _CAPTION.finditer(text)]
    out: dict[int, tuple[list[str], str]] = {}
    for i, num in enumerate(nums):
        lo = starts[i - 1] if i else 0
        before = [ln for ln in text[lo : starts[i]].splitlines() if "\t" in ln]
        after = [ln for ln in text[starts[i] : starts[i + 1]].splitlines() if "\t" in ln]
        out[num] = (before or after, text[lo : starts[i + 1]])
    return out


def _tokens(line: str) -> set[str]:
    return set(_NUMBER.findall(_delatex(line)))


# -- structural: run without the paper -------------------------------------------------------


def test_every_result_table_has_cells_and_one_caption() -> None:
    rows = _raw_rows()
    by_table: dict[int, set[str]] = {}
    for r in rows:
        by_table.setdefault(int(r["table"]), set()).add(r["caption"])
    assert set(by_table) == RESULT_TABLES  # Table 4 (adapter specification) holds no results
    for num, captions in by_table.items():
        assert len(captions) == 1, f"Table {num} has {len(captions)} captions"
        (caption,) = captions
        assert caption.strip() == caption and caption, f"Table {num}: empty caption"
        assert "\n" not in caption and not caption.startswith("Table ")


def test_values_are_numbers_and_fields_are_filled() -> None:
    for r in _raw_rows():
        assert r["row"].strip() and r["column"].strip(), r
        value = r["value"]
        assert value == value.strip() and value, r
        core = value.replace("%", "").replace("×", "").replace("±", "").replace(",", "")
        float(core.lstrip("~"))  # raises on anything but a number
        assert r["n"] == "" or (r["n"].isdigit() and int(r["n"]) > 0), r


def test_cells_are_unique_except_the_paper_s_repeated_rows() -> None:
    keys = Counter((r["table"], r["row"], r["column"]) for r in _raw_rows())
    repeated = {k for k, c in keys.items() if c > 1}
    # Table 16 prints "Tx-Full" three times, one row per cf_p.
    assert {(t, row) for t, row, _ in repeated} <= {("16", "Tx-Full")}


def test_loader_matches_the_csv() -> None:
    cells = load_cells()
    rows = _raw_rows()
    assert len(cells) == len(rows)
    for cell, r in zip(cells, rows, strict=True):
        assert isinstance(cell, PaperCell)
        assert (cell.table, cell.row, cell.column, cell.value, cell.caption) == (
            int(r["table"]),
            r["row"],
            r["column"],
            r["value"],
            r["caption"],
        )
        assert cell.n == (int(r["n"]) if r["n"] else None)
        assert cell.number == parse_number(r["value"])
    assert tables() == {c.table: c.caption for c in cells}
    assert list(tables()) == sorted(RESULT_TABLES)
    with pytest.raises(AttributeError):
        cells[0].value = "1"  # type: ignore[misc]


def test_parse_number() -> None:
    assert parse_number("1,163.2") == 1163.2
    assert parse_number("75%") == 75.0
    assert parse_number("~50") == 50.0
    assert parse_number("-27") == -27.0


# -- against the paper's text: skipped when it is absent ------------------------------------


def test_captions_quote_the_paper() -> None:
    paper = _squash(_paper_text())
    for num, caption in tables().items():
        assert _squash(f"Table {num}: {caption}") in paper, f"Table {num} caption not in paper"


def test_table_4_is_not_a_results_table() -> None:
    body, block = _blocks(_paper_text())[4]
    assert "Table 4: Adapter specification examples" in block
    assert "Idempotency key pattern" in body[0]


def _row_runs(cells: list[PaperCell]) -> list[list[PaperCell]]:
    """Cells grouped by printed row: consecutive cells of one (table, row), split where a
    column repeats (Table 16 prints the same label on consecutive rows)."""
    runs: list[list[PaperCell]] = []
    for cell in cells:
        run = runs[-1] if runs else None
        if (
            run
            and (run[0].table, run[0].row) == (cell.table, cell.row)
            and cell.column not in {c.column for c in run}
        ):
            run.append(cell)
        else:
            runs.append([cell])
    return runs


def _is_subsequence(needles: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


def test_every_value_is_on_its_row_line_in_its_own_table() -> None:
    blocks = _blocks(_paper_text())
    missing = []
    for cell in load_cells():
        body, block = blocks[cell.table]
        token = cell.value.lstrip("~")
        lines = [ln for ln in body if _delatex(ln.split("\t")[0]).strip() == cell.row]
        if not lines:
            missing.append((cell.table, cell.row, cell.column, cell.value, "no row line"))
        elif not any(token in _tokens(ln) for ln in lines):
            missing.append((cell.table, cell.row, cell.column, cell.value, "not on row line"))
        if token not in _tokens(block):
            missing.append((cell.table, cell.row, cell.column, cell.value, "not in block"))
    assert not missing, missing


def test_each_row_s_values_appear_in_printed_order() -> None:
    blocks = _blocks(_paper_text())
    for run in _row_runs(load_cells()):
        body, _ = blocks[run[0].table]
        wanted = [c.value.lstrip("~") for c in run]
        lines = [ln for ln in body if _delatex(ln.split("\t")[0]).strip() == run[0].row]
        seqs = [_NUMBER.findall(_delatex("\t".join(ln.split("\t")[1:]))) for ln in lines]
        assert any(_is_subsequence(wanted, seq) for seq in seqs), (run[0].table, run[0].row, wanted)


def test_every_printed_row_has_cells() -> None:
    """No row of a result table is forgotten: the labels of its body lines, less the header
    line (the first with a label; continuation header lines start with a tab), are the rows
    of the data file."""
    blocks = _blocks(_paper_text())
    cells = load_cells()
    for num in RESULT_TABLES:
        body, _ = blocks[num]
        labels = [_delatex(ln.split("\t")[0]).strip() for ln in body]
        printed = [lb for lb in labels if lb][1:]
        assert set(printed) == {c.row for c in cells if c.table == num}, num


def test_n_is_stated_in_the_table_or_caption() -> None:
    blocks = _blocks(_paper_text())
    for cell in load_cells():
        if cell.n is not None:
            assert str(cell.n) in _tokens(blocks[cell.table][1]), cell


# -- every number printed on a result table's row is a cell, or is listed here with a reason --

#: Fields the text extraction prints with a stray leading digit: the LaTeX source pads a short
#: value with an invisible digit so that the column's decimal points line up (``0.0`` under
#: ``112.3``, ``92`` under ``115``), and the extraction prints that digit. (table, row) -> the
#: field as printed; its first number is the padding, not a value, and its second is the cell.
#: That the padding is no digit of the value shows in the rows themselves: each of these
#: Table 1 rows blocks 0% of its tasks, so its mean wait is 0.0 ms, not 10.0.
ALIGNMENT_PADDING: dict[tuple[int, str], str] = {
    (1, "Tx-Full"): "1 0.0",
    (1, "Per-Call-Lock"): "1 0.0",
    (1, "OCC-Revalidate-and-Retry"): "1 0.0",
    (1, "No-Tx"): "1 0.0",
    (3, "Tx-Full"): "1 0.1",
    (3, "OCC"): "1 0.0",
    (3, "TCC-Confirm"): "1 0.1",
    (3, "Mutex+WAL+Rollback"): "1 0.4",
    (11, "Tx-Full (control)"): "1 0.0",
    (11, "Tx-NoScopeOnRead"): "1 0.0",
    (11, "Tx-NoAbortOnStale"): "1 0.0",
    (14, "Saga-Compensation"): "0 92",
}

# "20/30" and "0/200": a count over the N it was counted of.
_FRACTION = re.compile(r"(\d+)/(\d+)")


def _data_lines(body: list[str]) -> list[tuple[str, list[str]]]:
    """(row label, its value fields) of every row line of a table body: the labelled lines
    after the header line (the first labelled one; continuation header lines have no label)."""
    labelled = [ln.split("\t") for ln in body if _delatex(ln.split("\t")[0]).strip()]
    return [(_delatex(f[0]).strip(), [_delatex(x) for x in f[1:]]) for f in labelled[1:]]


def unaccounted_numbers(cells: list[PaperCell], text: str) -> list[tuple[int, str, str, str]]:
    """(table, row, number, why) for every number printed on a row of a result table that no
    cell of that row accounts for, and every cell its row does not print.

    A row line's numbers are read in printed order against the row's cells in file order
    (the paper's order, which the data file keeps). Each number is one of: a number in the
    row label (``2`` in Table 17's row ``2``, ``10`` in ``E10-OB``), not a cell; the next
    cell's value; the N of a printed count ``a/N`` whose cell is ``a`` with ``n`` = N
    (``20/30 = 67%``, ``0/200``); or the alignment padding of ``ALIGNMENT_PADDING``. Where
    a row prints the same value side by side, a missing cell may be reported at its
    neighbour's field: the count of unaccounted numbers is exact, the field is a hint."""
    blocks = _blocks(text)
    runs: dict[tuple[int, str], list[list[PaperCell]]] = {}
    for run in _row_runs(cells):
        runs.setdefault((run[0].table, run[0].row), []).append(run)
    padding_seen: set[tuple[int, str]] = set()
    problems: list[tuple[int, str, str, str]] = []
    for num in sorted(RESULT_TABLES):
        seen: Counter[str] = Counter()
        for label, fields in _data_lines(blocks[num][0]):
            occurrence = seen[label]
            seen[label] += 1
            row_runs = runs.get((num, label), [])
            pending = list(row_runs[occurrence]) if occurrence < len(row_runs) else []
            for field in fields:
                tokens = list(_NUMBER.finditer(field))
                if ALIGNMENT_PADDING.get((num, label)) == field.strip():
                    padding_seen.add((num, label))
                    tokens = tokens[1:]
                # Where each printed a/N puts its N -> its a.
                counts = {m.start(2): m.group(1) for m in _FRACTION.finditer(field)}
                last: PaperCell | None = None
                for match in tokens:
                    token = match.group()
                    count = counts.get(match.start())
                    if last is not None and count == last.value and last.n == int(token):
                        continue  # the N of a count a/N, stated as the cell's n
                    if pending and pending[0].value.lstrip("~") == token:
                        last = pending.pop(0)
                    else:
                        problems.append((num, label, token, f"printed in {field.strip()!r}, no cell"))
            problems += [(num, label, c.value, f"cell {c.column!r} not printed") for c in pending]
    problems += [
        (t, row, ALIGNMENT_PADDING[(t, row)], "listed as padding, not printed so")
        for t, row in sorted(set(ALIGNMENT_PADDING) - padding_seen)
    ]
    return problems


def test_every_number_on_a_result_row_is_a_cell_or_explained() -> None:
    """A cell the data file drops (a value the extraction split or merged, say) cannot go
    unnoticed: every number printed on a row line of a result table is accounted for."""
    problems = unaccounted_numbers(load_cells(), _paper_text())
    assert not problems, "\n".join(map(str, problems))


def test_the_accounting_notices_a_dropped_cell() -> None:
    cells = load_cells()
    dropped = next(c for c in cells if (c.table, c.row, c.column) == (3, "OCC", "Wait (ms)"))
    problems = unaccounted_numbers([c for c in cells if c is not dropped], _paper_text())
    assert problems == [(3, "OCC", "0.0", "printed in '1 0.0', no cell")]
