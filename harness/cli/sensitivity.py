"""`atomix sensitivity`: do a config's verdicts survive other plausible agent weights?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table as RichTable
from rich.text import Text

from harness.cli.common import EXIT_DISK, fail, jobs_default, stderr, stdout
from harness.cli.options import ConfigArg, Jobs
from harness.errors import ConfigError, RunError

commands = typer.Typer()


@commands.command(
    "sensitivity",
    short_help="Test how the verdicts hold under other agent weights.",
    epilog="Example: atomix sensitivity configs/tau_retail.yaml --quick"
)
def sensitivity(
    config: ConfigArg,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Fewer random designs (4 unless --designs) and the first third of each "
            "cell's trials.",
        ),
    ] = False,
    designs: Annotated[
        int | None,
        typer.Option(
            "--designs",
            min=0,
            max=200,
            help="Random design points besides the one-at-a-time ones (default 12; 4 with "
            "--quick).",
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Where <config>-sensitivity.csv, <config>-designs.csv and "
            "<config>-sensitivity.md are written.",
        ),
    ] = Path("results/sensitivity"),
    jobs: Jobs = None,
) -> None:
    """Re-run an llm-like config with each agent weight at 50% and 150% of its default (one
    at a time) and at random points in that range, on the same trials; print how often each
    paired verdict of the main table (each mode against the baseline, per cell) reads as
    with the default weights, and Kendall's tau-b of the mode ranking."""
    from harness.analysis import sensitivity as sens
    from harness.experiment.interrupts import exit_code

    if out.exists() and not out.is_dir():
        raise typer.BadParameter(f"{out}: exists and is not a directory", param_hint="--out")
    try:
        result = sens.run_sensitivity(
            config,
            designs=designs,
            quick=quick,
            jobs=jobs or jobs_default(),
            say=lambda line: stderr().print(Text(line), soft_wrap=True),
        )
    except (ConfigError, RunError, sens.SensitivityError) as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:
        fail("interrupted: nothing was written", exit_code(exc))
    table = RichTable(
        title=Text(
            f"{result.metric}: each mode against {result.baseline}, verdict under the default "
            f"weights and how often it holds across {len(result.others)} other designs"
        ),
        caption=Text(sens.summary_line(result)),
    )
    for i, h in enumerate(sens.verdict_header()):
        table.add_column(Text(h), justify="right" if i in (3, 4, 5) else "left")
    for row in sens.verdict_rows(result):
        table.add_row(*(Text(c) for c in row))
    stdout().print(table)
    designs_table = RichTable(title=Text("Designs"))
    for i, h in enumerate(sens.design_header()):
        designs_table.add_column(Text(h), justify="left" if i in (0, 9) else "right")
    for row in sens.design_rows(result):
        designs_table.add_row(*(Text(c) for c in row))
    stdout().print(designs_table)
    try:
        paths = sens.write_sensitivity(result, out)
    except OSError as exc:
        fail(f"{out}: cannot write ({exc.strerror or exc})", EXIT_DISK)
    for path in paths:
        stdout().print(Text(f"wrote {path}"), soft_wrap=True)
    stdout().print(Text(f"{len(result.designs)} designs in {result.wall_s:.1f} s"), soft_wrap=True)
