"""Options and arguments that more than one command group takes, spelled once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Jobs = Annotated[
    int | None,
    typer.Option(
        "--jobs", "-j", min=1, help="Worker processes (default: the number of CPUs, at most 8)."
    ),
]
ConfigArg = Annotated[
    Path,
    typer.Argument(metavar="CONFIG.yaml", help="Experiment config (YAML).", show_default=False),
]
Configs = Annotated[
    Path | None,
    typer.Option(
        "--configs",
        help="Directory of experiment configs (default: ./configs, else the repo's).",
    ),
]
MaxCells = Annotated[
    int | None,
    typer.Option("--max-cells", min=1, help="Refuse a config with more cells (default 1,000)."),
]
MaxTrials = Annotated[
    int | None,
    typer.Option(
        "--max-trials",
        min=1,
        help="Refuse a config planning more trials, cells x modes x trials (default 1,000,000).",
    ),
]
