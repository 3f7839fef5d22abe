"""Checks of a config's `paper:` section against the paper's own cells
(`harness.experiment.paper_cells`): tables, rows and columns must be the paper's, and the
modes and cell parameters it selects must be the config's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from harness.experiment.cells import GridConfig, cell_label, expand_cells
from harness.experiment.sections import PaperRowModel, PaperTableModel
from harness.registry import did_you_mean


class MappedConfig(GridConfig, Protocol):
    """What the checks read of a config (an `ExperimentConfig`)."""

    modes: list[str]
    paper: list[PaperTableModel]


def table_ranges(numbers: Iterable[int]) -> str:
    """`1-3, 5-21` for [1, 2, 3, 5, ..., 21]."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and spans[-1][1] == n - 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def _cell_values(config: MappedConfig) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """(label -> the values its cells give it, dotted key or label -> label)."""
    values: dict[str, list[Any]] = {}
    names: dict[str, str] = {}
    for cell in expand_cells(config):
        for key, value in cell.items():
            label = cell_label(config, key)
            names[key] = names[label] = label
            seen = values.setdefault(label, [])
            if not any(_same_value(v, value) for v in seen):
                seen.append(value)
    return values, names


def _same_value(a: Any, b: Any) -> bool:
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _selection_problems(
    config: MappedConfig, selection: Mapping[str, Any], where: str
) -> list[str]:
    values, names = _cell_values(config)
    problems = []
    for key, value in selection.items():
        label = names.get(key)
        if label is None:
            allowed = sorted(values)
            hint = did_you_mean(key, allowed)
            problems.append(
                f"{where}.cell.{key}: not a cell parameter of this config{hint}; allowed: {allowed}"
            )
        elif not any(_same_value(v, value) for v in values[label]):
            problems.append(
                f"{where}.cell.{key}: {value!r} is not a value of {label} in this config; "
                f"its values: {values[label]}"
            )
    return problems


def paper_problems(config: MappedConfig, against_config: bool = True) -> list[str]:
    """What is wrong with the `paper` section, one line per problem naming its key ([] if
    nothing): tables, rows and columns must be the paper's (harness/experiment/paper_cells.csv), a
    column that is a part of another (`... / 95% CI lower`) is not mapped on its own, `of`
    names a mapped column, `unmapped` names rows or columns that are not mapped, and a
    `count` needs the paper's N. With `against_config`, the modes and cell parameters the
    section names must also be this config's (skipped for a run whose modes or cells an
    override narrowed)."""
    from harness.experiment.paper_cells import cells_by_table, split_part

    by_table = cells_by_table()
    problems: list[str] = []
    seen: dict[tuple[int, bool], int] = {}
    for i, entry in enumerate(config.paper):
        at = f"paper.{i}"
        cells = by_table.get(entry.table)
        if cells is None:
            hint = did_you_mean(str(entry.table), [str(t) for t in by_table])
            problems.append(
                f"{at}.table: {entry.table} is not a result table of the paper{hint}; "
                f"allowed: {table_ranges(by_table)}"
            )
            continue
        key = (entry.table, bool(entry.variant))
        if key in seen:
            problems.append(
                f"{at}.table: Table {entry.table} is mapped twice here (also paper.{seen[key]}); "
                "put its rows and columns in one entry"
            )
        seen.setdefault(key, i)
        rows = list(dict.fromkeys(c.row for c in cells))
        columns = list(dict.fromkeys(c.column for c in cells))
        # Table 16 prints one row label for several rows (one per cf_p).
        repeats = {
            r: max(sum(1 for c in cells if c.row == r and c.column == col) for col in columns)
            for r in rows
        }
        for label, target in entry.rows.items():
            where = f"{at}.rows.{label}"
            if label not in rows:
                problems.append(
                    f"{where}: not a row of Table {entry.table}{did_you_mean(label, rows)}; "
                    f"its rows: {rows}"
                )
                continue
            targets = target if isinstance(target, list) else [target]
            if isinstance(target, list) and not 1 <= len(target) <= repeats[label]:
                problems.append(
                    f"{where}: Table {entry.table} prints row {label!r} {repeats[label]} time(s); "
                    f"give 1 to {repeats[label]} targets, in the paper's order (got {len(target)})"
                )
            if not against_config:
                continue
            for j, tg in enumerate(targets):
                here = f"{where}.{j}" if isinstance(target, list) else where
                mode = tg if isinstance(tg, str) else tg.mode
                if mode is None and len(config.modes) != 1:
                    problems.append(f"{here}.mode: required, the config runs {len(config.modes)} modes")
                elif mode is not None and mode not in config.modes:
                    hint = did_you_mean(mode, config.modes)
                    problems.append(
                        f"{here}: mode {mode!r} is not run by this config{hint}; its modes: "
                        f"{', '.join(config.modes)}"
                    )
                if isinstance(tg, PaperRowModel):
                    problems += _selection_problems(config, tg.cell, here)
        for label, column in entry.columns.items():
            where = f"{at}.columns.{label}"
            if label not in columns:
                problems.append(
                    f"{where}: not a column of Table {entry.table}{did_you_mean(label, columns)}; "
                    f"its columns: {columns}"
                )
                continue
            base, part = split_part(label)
            if part is not None and base in columns:
                problems.append(
                    f"{where}: the {part} of column {base!r}, shown with it; map {base!r} instead"
                )
            if column.of is not None:
                target = entry.columns.get(column.of)
                if target is None or target.of is not None:
                    problems.append(
                        f"{where}.of: {column.of!r} is not a column this entry maps with a metric"
                    )
                continue
            if column.stat == "count" and any(c.n is None for c in cells if c.column == label):
                problems.append(
                    f"{where}.stat: count needs the paper's N, which Table {entry.table} does not "
                    "state for this column; use proportion, or leave the column unmapped"
                )
            if against_config:
                problems += _selection_problems(config, column.cell, where)
        for label in entry.unmapped:
            where = f"{at}.unmapped.{label}"
            if label not in rows and label not in columns:
                hint = did_you_mean(label, [*rows, *columns])
                problems.append(f"{where}: not a row or column of Table {entry.table}{hint}")
            elif label in entry.rows or label in entry.columns:
                problems.append(f"{where}: is mapped too; a label is mapped or unmapped, not both")
    return problems
