"""`atomix claims`: the paper's claims tested by ablation, one paired comparison per row."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table as RichTable
from rich.text import Text

from harness.cli.common import EXIT_DISK, configs_dir, fail, jobs_default, stderr, stdout
from harness.cli.options import Configs, Jobs
from harness.errors import ConfigError, RunError

commands = typer.Typer()


def _fits(console: Console, table: RichTable) -> bool:
    """Does `table` fit the console's width with its cells wrapped only between words?"""
    unlimited = console.options.update_width(1_000_000)
    return Measurement.get(console, unlimited, table).minimum <= console.width


@commands.command(
    "claims",
    short_help="Test each claim of the paper by ablating one component.",
    epilog="Example: atomix claims --quick --out results/claims",
)
def claims(
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="N per cell and mode = a fifth of each config's trials, at least 20 (at most "
            "the config's own); default: each config's own N.",
        ),
    ] = False,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Where runs go (OUT/<config>/<run-id>; finished ones are reused, unfinished "
            "ones resumed) and where claims.csv and claims.md are written.",
        ),
    ] = Path("results/claims"),
    jobs: Jobs = None,
    configs: Configs = None,
) -> None:
    """Test each claim of the paper by removing one mechanism component: tx-full against
    the ablation that removes only it, paired on the same trials, Holm-adjusted across the
    whole table; print the table and write OUT/claims.csv and OUT/claims.md."""
    from harness.experiment.interrupts import exit_code
    from harness.experiment.rundir import RunIOError
    from harness.paper import claims as cl

    configs = configs_dir(configs)
    if not configs.is_dir():
        raise typer.BadParameter(f"{configs}: not a directory", param_hint="--configs")
    command = shlex.join(["atomix", "claims", *(["--quick"] if quick else []), "--out", str(out)])
    try:
        result = cl.run_claims(
            quick=quick,
            out=out,
            jobs=jobs or jobs_default(),
            configs_dir=configs,
            command=command,
            say=lambda line: stderr().print(Text(line), soft_wrap=True),
        )
    except cl.OutError as exc:
        raise typer.BadParameter(str(exc), param_hint="--out") from None
    except RunIOError as exc:
        fail(f"{exc}; finished trials are kept: run the same command again to resume", EXIT_DISK)
    except (ConfigError, RunError) as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:
        fail(
            f"interrupted: finished trials are kept under {out}; run the same command again "
            "to resume",
            exit_code(exc),
        )
    console = stdout()
    rows = cl.display_rows(result.results)
    header = cl.DISPLAY_HEADER[1:]  # one table per claim, the claim its title
    for claim in dict.fromkeys(row[0] for row in rows):
        table = RichTable(title=Text(f"{claim}: tx-full against each ablation, paired"))
        for h in header:
            # Mode names and numbers are never wrapped; nothing is cut to an ellipsis,
            # which would make one mode or metric read as another.
            table.add_column(
                Text(h),
                justify="right" if h in cl.DISPLAY_HEADER[5:11] else "left",
                no_wrap=h in ("ablation", "pairs", "+/-", "effect", "p (Holm)"),
                min_width=21 if h == "metric" else None,
                overflow="fold",
            )
        own = [row for row in rows if row[0] == claim]
        for row in own:
            table.add_row(*(Text(c) for c in row[1:]))
        if _fits(console, table):
            console.print(table)
            continue
        # Too wide for this terminal: each row as lines of `header: value`, nothing cut.
        console.print(Text(f"{claim}: tx-full against each ablation, paired", style="italic"))
        for row in own:
            for h, c in zip(header, row[1:], strict=True):
                console.print(Text(f"  {h}: {c.replace(chr(10), ' ')}"), soft_wrap=True)
            console.print()
    console.print(
        Text(
            "effect = tx-full minus the ablation, positive when tx-full did better (yes/no "
            "metrics in percentage points); +/- = pairs where tx-full did better/worse; p "
            "Holm-adjusted over the whole table"
        ),
        soft_wrap=True,
    )
    none = cl.unseparated(result.results)
    console.print(
        Text("no row separates: " + ", ".join(none) if none else "every component is separated"),
        soft_wrap=True,
    )
    console.print(Text(f"wrote {', '.join(str(p) for p in result.paths)}"), soft_wrap=True)
