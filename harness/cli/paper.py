"""The paper: `reproduce` runs the configs behind its result tables and compares."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from harness.cli.common import EXIT_DISK, configs_dir, fail, jobs_default, stderr, stdout
from harness.cli.options import Configs, Jobs
from harness.errors import ConfigError, RunError

commands = typer.Typer()


@commands.command(
    "reproduce",
    short_help="Run the paper's tables and write REPRODUCTION.md.",
    epilog="Example: atomix reproduce --quick --tables 6,16 --out results/reproduction"
)
def reproduce(
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="N per cell and mode = a fifth of each config's trials, at least 20 (at most "
            "the config's own); default: each config's own N.",
        ),
    ] = False,
    tables_: Annotated[
        str | None,
        typer.Option("--tables", help="Comma-separated paper tables (default: all, 1-3 and 5-21)."),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Where runs go (OUT/<config>/<run-id>; finished ones are reused, unfinished "
            "ones resumed) and where REPRODUCTION.md is written.",
        ),
    ] = Path("results/reproduction"),
    jobs: Jobs = None,
    configs: Configs = None,
) -> None:
    """Run the configs that map the paper's result tables, then write OUT/REPRODUCTION.md:
    each paper cell beside ours, with our 95% interval and N, a verdict (reproduced,
    differs, not comparable) and, for a difference, its explanation by mechanism; then each
    mode's retry budget and, without --tables, the claims table (`atomix claims`, runs under
    OUT/claims) and the sensitivity of the headline verdicts to the agent's weights."""
    from harness.experiment.interrupts import exit_code
    from harness.experiment.rundir import RunIOError
    from harness.paper import reproduce as rp

    wanted = None
    if tables_ is not None:
        try:
            wanted = rp.parse_tables(tables_)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--tables") from None
    configs = configs_dir(configs)
    if not configs.is_dir():
        raise typer.BadParameter(f"{configs}: not a directory", param_hint="--configs")
    command = ["atomix", "reproduce", *(["--quick"] if quick else [])]
    command += [*(["--tables", ",".join(map(str, wanted))] if wanted else []), "--out", str(out)]
    try:
        outcome = rp.reproduce(
            wanted=wanted,
            quick=quick,
            out=out,
            jobs=jobs or jobs_default(),
            configs_dir=configs,
            command=shlex.join(command),
            say=lambda line: stderr().print(Text(line), soft_wrap=True),
        )
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
    counts = {rp.REPRODUCED: 0, rp.DIFFERS: 0, rp.UNEXPLAINED: 0, rp.NOT_COMPARABLE: 0}
    for section in outcome.sections:
        if not section.variant:
            for kind, n in section.counts().items():
                counts[kind] += n
    stdout().print(
        f"wrote {outcome.path}: {counts[rp.REPRODUCED]} cells reproduced, "
        f"{counts[rp.DIFFERS]} differ ({counts[rp.UNEXPLAINED]} unexplained), "
        f"{counts[rp.NOT_COMPARABLE]} not comparable; {outcome.wall_s:.0f} s wall, "
        f"{outcome.cpu_s:.0f} s CPU",
        soft_wrap=True,
    )
