"""Which of our cells answers which paper cell: the configs' ``paper:`` sections.

A config's ``paper:`` section says which paper row is which of our modes and cells, and
which paper column is which statistic of which metric. This module finds the configs that
map the wanted tables (``sources``, at the N they run with), checks that no two claim the
same cell (``overlap_problems``), lays a paper table out as judged cells with the parts the
paper prints beside them (``judged_cells``), and finds the mapping of one cell
(``mapping_for``) or the reason there is none.

``--quick`` runs every config with N = ``quick_trials(trials)``: a fifth of the config's
trials, at least ``QUICK_FLOOR`` and never more than the config's own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.agents.loops import missing_packages
from harness.experiment.cells import cell_label
from harness.experiment.config import ExperimentConfig, load_config
from harness.experiment.paper_cells import PaperCell, split_part, tables
from harness.experiment.paper_section import table_ranges
from harness.experiment.sections import PaperColumnModel, PaperRowModel, PaperTableModel
from harness.experiment.yamlload import MAX_BYTES, YamlInputError, load_yaml

__all__ = [
    "QUICK_DIVISOR",
    "QUICK_FLOOR",
    "Source",
    "config_files",
    "judged_cells",
    "mapping_for",
    "overlap_problems",
    "paper_text",
    "parse_tables",
    "quick_trials",
    "selection",
    "sources",
    "unavailable",
]

#: --quick: N = max(QUICK_FLOOR, ceil(trials / QUICK_DIVISOR)), capped at the config's trials.
QUICK_FLOOR = 20
QUICK_DIVISOR = 5


def quick_trials(trials: int) -> int:
    """N per cell and mode under --quick: a fifth of `trials`, at least QUICK_FLOOR, at most
    `trials`."""
    return min(trials, max(QUICK_FLOOR, math.ceil(trials / QUICK_DIVISOR)))


def parse_tables(text: str) -> list[int]:
    """`"1,6, 16"` -> [1, 6, 16] (sorted, once each); ValueError naming a bad item, the
    nearest result table and the allowed ones."""
    known = sorted(tables())
    out: set[int] = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            number = int(item.removeprefix("Table").removeprefix("table").strip())
        except ValueError:
            raise ValueError(
                f"{item!r} is not a table number; allowed: {table_ranges(known)}"
            ) from None
        if number not in known:
            best = min(abs(k - number) for k in known)
            near = [str(k) for k in known if abs(k - number) == best]
            why = (
                " (Table 4 is the adapter specification and holds no results)"
                if number == 4
                else ""
            )
            raise ValueError(
                f"{number} is not a result table of the paper{why}; did you mean "
                f"{' or '.join(near)}?; allowed: {table_ranges(known)}"
            )
        out.add(number)
    if not out:
        raise ValueError(f"no table given; allowed: {table_ranges(known)}")
    return sorted(out)


# --------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class Source:
    """A config file and the config loaded from it (with the run's trial count)."""

    path: Path
    config: ExperimentConfig

    @property
    def name(self) -> str:
        """The config's name, else its file's stem (runs are stored under it)."""
        return self.config.name or self.path.stem

    def entries(self, table: int) -> list[tuple[int, PaperTableModel]]:
        """(index in `paper:`, entry) of every entry that maps `table`."""
        return [(i, e) for i, e in enumerate(self.config.paper) if e.table == table]


def _raw(path: Path) -> dict[str, Any] | None:
    """A config file read as a mapping without validating it (None when it cannot be: load
    it to see why)."""
    try:
        with path.open("rb") as fh:
            data = load_yaml(fh.read(MAX_BYTES + 1))
    except (OSError, YamlInputError):
        return None
    return data if isinstance(data, dict) else None


def _paper_tables(data: dict[str, Any] | None) -> set[int] | None:
    """The tables a raw config's `paper:` section names (None when it cannot tell)."""
    if data is None:
        return None
    entries = data.get("paper") or []
    if not isinstance(entries, list):
        return None
    return {
        e.get("table") for e in entries if isinstance(e, dict) and isinstance(e.get("table"), int)
    }


def config_files(configs_dir: Path) -> list[Path]:
    """The config files directly under `configs_dir`, sorted."""
    return sorted([*Path(configs_dir).glob("*.yaml"), *Path(configs_dir).glob("*.yml")])


def unavailable(data: dict[str, Any] | None) -> str | None:
    """Why a raw config cannot run here: its agent kind needs a package that is not
    installed (what to install is said); None when nothing is missing."""
    agent = data.get("agent") if data is not None else None
    kind = agent.get("kind") if isinstance(agent, dict) else None
    missing = missing_packages(kind) if isinstance(kind, str) else {}
    if not missing:
        return None
    packages = " and ".join(f"the {p} package" for p in missing)
    verb = "is" if len(missing) == 1 else "are"
    installs = "; ".join(dict.fromkeys(missing.values()))
    return f"its agent (agent.kind {kind}) needs {packages}, which {verb} not installed: {installs}"


def sources(
    configs_dir: Path,
    wanted: Iterable[int],
    quick: bool,
    skipped: dict[Path, tuple[str, str]] | None = None,
) -> list[Source]:
    """Every config under `configs_dir` whose `paper:` section maps one of `wanted`, loaded
    and checked (ConfigError otherwise), with its trials cut to `quick_trials` if `quick`.
    With `skipped`, a config that cannot run here (`unavailable`) is left out and put there
    (path -> (its name, why)) instead of failing to load."""
    wanted = set(wanted)
    out: list[Source] = []
    for path in config_files(configs_dir):
        data = _raw(path)
        named = _paper_tables(data)
        if named is not None and not named & wanted:
            continue
        why = unavailable(data) if skipped is not None else None
        if why is not None:
            assert skipped is not None
            name = data.get("name") if data is not None else None
            skipped[path] = (name if isinstance(name, str) and name else path.stem, why)
            continue
        config = load_config(path)
        if not {e.table for e in config.paper} & wanted:
            continue
        if quick and quick_trials(config.trials) != config.trials:
            config = load_config(path, overrides={"trials": quick_trials(config.trials)})
        out.append(Source(path, config))
    return out


def _targets(entry: PaperTableModel, row: str) -> list[PaperRowModel]:
    # A paper row maps to one target, or to a list when the paper repeats the row label.
    target = entry.rows.get(row)
    if target is None:
        return []
    targets = target if isinstance(target, list) else [target]
    return [PaperRowModel(mode=t) if isinstance(t, str) else t for t in targets]


def overlap_problems(all_sources: Sequence[Source]) -> list[str]:
    """Paper cells that two configs both claim as the primary reproduction, one line each."""
    claimed: dict[tuple[int, str, int, str], str] = {}
    problems: list[str] = []
    for src in all_sources:
        for i, entry in enumerate(src.config.paper):
            if entry.variant:
                continue
            for row, target in entry.rows.items():
                count = len(target) if isinstance(target, list) else 1
                for k in range(count):
                    for column in entry.columns:
                        key = (entry.table, row, k, column)
                        where = f"{src.path}: paper.{i}"
                        if key in claimed:
                            problems.append(
                                f"{where}: Table {entry.table} row {row!r} column {column!r} is "
                                f"also mapped by {claimed[key]}; one config reproduces a cell, "
                                "another may map it only as a `variant`"
                            )
                        claimed.setdefault(key, where)
    return problems


def selection(config: ExperimentConfig, *parts: Mapping[str, Any]) -> dict[str, Any]:
    """Cell parameters by their labels (as records name them), later parts winning."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[cell_label(config, key)] = value
    return out


# --------------------------------------------------------------------------- paper cells


def paper_text(base: PaperCell, parts: Mapping[str, PaperCell]) -> str:
    """A paper cell as printed, with the interval, half-width or count printed beside it."""
    text = base.value
    if "lower" in parts and "upper" in parts:
        text += f" [{parts['lower'].value}, {parts['upper'].value}]"
    if "half-width" in parts:
        text += f" ± {parts['half-width'].value}"
    if "count" in parts:
        count = parts["count"]
        text += f" ({count.value}/{count.n})" if count.n else f" ({count.value})"
    return text


def judged_cells(
    cells: Sequence[PaperCell], extra_parts: Mapping[str, tuple[str, str]]
) -> list[tuple[PaperCell, int, dict[str, PaperCell]]]:
    """(base cell, occurrence of its row label, its parts) in the paper's order. A column
    is a part when its name says so (`... / 95% CI lower`) or a config maps it `of` another
    (`extra_parts`: column -> (base column, part))."""
    columns = {c.column for c in cells}
    seen: dict[tuple[str, str], int] = {}
    bases: list[tuple[PaperCell, int, dict[str, PaperCell]]] = []
    index: dict[tuple[str, int, str], dict[str, PaperCell]] = {}
    pending: list[tuple[str, int, str, str, PaperCell]] = []
    for cell in cells:
        occurrence = seen.get((cell.row, cell.column), 0)
        seen[(cell.row, cell.column)] = occurrence + 1
        base, part = split_part(cell.column)
        if part is None and cell.column in extra_parts:
            base, part = extra_parts[cell.column]
        if part is not None and base in columns:
            pending.append((cell.row, occurrence, base, part, cell))
            continue
        parts: dict[str, PaperCell] = {}
        index[(cell.row, occurrence, cell.column)] = parts
        bases.append((cell, occurrence, parts))
    for row, occurrence, base, part, cell in pending:
        target = index.get((row, occurrence, base))
        if target is not None:
            target[part] = cell
    return bases


def mapping_for(
    srcs: Sequence[Source], table: int, row: str, occurrence: int, column: str, variant: bool
) -> tuple[Source, PaperTableModel, PaperRowModel, PaperColumnModel] | str:
    """The (source, entry, row, column) that maps a cell, or the reason none does."""
    reasons: list[str] = []
    for src in srcs:
        for _, entry in src.entries(table):
            if bool(entry.variant) != variant:
                continue
            col = entry.columns.get(column)
            targets = _targets(entry, row)
            if col is not None and occurrence < len(targets):
                return src, entry, targets[occurrence], col
            if col is not None or column in entry.unmapped:
                why = entry.unmapped.get(row) or entry.unmapped.get(column)
                if why is None:
                    why = (
                        f"row {row!r} is not mapped"
                        if col is not None
                        else f"column {column!r} is not mapped"
                    )
                reasons.append(f"{why} ({src.name})")
            elif row in entry.unmapped:
                reasons.append(f"{entry.unmapped[row]} ({src.name})")
    if reasons:
        return "not mapped: " + "; ".join(dict.fromkeys(reasons))
    names = ", ".join(s.name for s in srcs)
    return f"not mapped: no config maps column {column!r}" + (f" ({names})" if names else "")
