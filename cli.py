"""The `atomix` command: run experiments, sweep parameters, rebuild reports, compare modes.

This module assembles the typer app; each command group lives in `harness.cli` (run, results,
catalog, paper, runtime) and is a thin wrapper over the harness's wings. Exit codes: 0
success, 1 the disk refused a write (full, read-only) or a dask cluster was lost mid-run (the
run stays resumable), 2 a bad config / bad option / unusable or locked run directory (nothing
is written), 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM (finished trials are kept).
"""

from __future__ import annotations

# isort: off
import harness.experiment.startup  # noqa: F401 - first: a signal during the imports below exits in one line
# isort: on

from typing import Annotated

import typer

from harness.cli import catalog, claims, paper, results, run, runtime, sensitivity, view
from harness.cli.common import OneLineErrors, with_short_help

app = typer.Typer(
    cls=OneLineErrors,
    name="atomix",
    help="Atomix evaluation harness: run agent workloads under settlement modes with injected faults.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    epilog="Example: atomix run configs/synthetic_fault_class.yaml --trials 20; atomix list modes",
)

# The order `atomix --help` lists the commands in: running and reading results first.
COMMANDS = (
    "run", "sweep", "report", "runs", "compare", "list", "reproduce", "validate", "recover",
    "mcp-proxy", "show", "claims", "sensitivity", "view",
)  # fmt: skip


def _version(value: bool) -> None:
    if value:
        # The installed distribution's version: importing atomix for __version__ would load
        # the whole runtime (the two agree; tests/test_cli.py checks it).
        from importlib.metadata import version

        typer.echo(f"atomix-tx {version('atomix-tx')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Atomix evaluation harness: run agent workloads under settlement modes with injected faults.

    Example: atomix run configs/synthetic_fault_class.yaml --trials 20
    """


def _add_commands(target: typer.Typer) -> None:
    """Add every group's commands to `target` in the order of COMMANDS."""
    groups = (run, results, catalog, paper, runtime, claims, sensitivity, view)
    by_name = {info.name: info for group in groups for info in group.commands.registered_commands}
    # A command defined in a group but not listed here would silently be missing from atomix.
    if set(by_name) != set(COMMANDS):
        raise RuntimeError(
            f"commands not in COMMANDS, or gone: {sorted(set(by_name) ^ set(COMMANDS))}"
        )
    target.registered_commands += [with_short_help(by_name[name]) for name in COMMANDS]


_add_commands(app)

if __name__ == "__main__":
    app()
