"""The cells of a config: its explicit `cells`, each crossed with its `grid`, and the one
spelling of a cell's id that record keys, table headers and `--set` share."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol


class GridConfig(Protocol):
    """What cell expansion reads of a config (an `ExperimentConfig`)."""

    cells: list[dict[str, Any]]
    grid: dict[str, list[Any]]
    labels: dict[str, str]



def count_cells(config: GridConfig) -> int:
    """How many cells `expand_cells` would make, without making them."""
    return len(config.cells or [{}]) * math.prod(len(v) for v in config.grid.values())


def expand_cells(config: GridConfig) -> list[dict[str, Any]]:
    """The cells: explicit `cells`, each crossed with the `grid` (or the grid alone)."""
    base = config.cells or [{}]
    keys = list(config.grid)
    combos = list(itertools.product(*(config.grid[k] for k in keys))) if keys else [()]
    return [{**cell, **dict(zip(keys, combo, strict=True))} for cell in base for combo in combos]


CELL_LABEL = "label"  # a cell key that names the cell instead of overriding a config key


def cell_label(config: GridConfig, key: str) -> str:
    return config.labels.get(key, key)


def format_cell(pairs: Iterable[tuple[str, Any]]) -> str:
    """The one spelling of a cell in text: `fp=0.0,retries=2` (labels, values as written,
    no spaces). Record keys hold it (as `cell_id`), so table headers, `--set` and messages
    use it too; changing it would orphan the records of existing runs."""
    return ",".join(f"{k}={_short(v)}" for k, v in pairs)


def cell_id(config: GridConfig, cell: Mapping[str, Any]) -> str:
    if not cell:
        return "all"
    if CELL_LABEL in cell:
        # A named cell is its label plus the grid keys it was crossed with.
        shown = {CELL_LABEL: cell[CELL_LABEL], **{k: v for k, v in cell.items() if k in config.grid}}
        return format_cell((cell_label(config, k), v) for k, v in shown.items())
    return format_cell((cell_label(config, k), v) for k, v in cell.items())


def _short(value: Any) -> str:
    if isinstance(value, str | int | float | bool):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
