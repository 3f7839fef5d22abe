"""What every command group shares: the consoles, one-line errors and exit codes, and
loading a config for the command line."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
import typer.core
from rich.console import Console
from rich.text import Text
from typer._click import exceptions as click  # typer vendors click (BadParameter, ...)

from harness.errors import ConfigError

if TYPE_CHECKING:
    from harness.experiment.config import ExperimentConfig, SizeLimits

EXIT_DISK = 1
EXIT_CONFIG = 2

# The repository's configs, for a command run outside a checkout's root.
REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class OneLineErrors(typer.core.TyperGroup):
    """A bad option or argument is one line naming it (`atomix run: Invalid value for
    '--trials': ...`), not a usage banner and a box."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except click.BadParameter as exc:
            where = exc.ctx.command_path if exc.ctx else "atomix"
            more = f" (see: {where} --help)" if exc.ctx else ""
            stderr().print(Text(f"{where}: {exc.format_message()}{more}", style="red"))
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
            sys.exit(exc.exit_code)
        except typer.Abort:
            stderr().print("Aborted!")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def stdout() -> Console:
    """The console for results (stdout)."""
    # Built per call so that it writes to the current sys.stdout (tests swap it). A pipe gets
    # a wide console, so tables are not squeezed to 80 columns.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(width=200 if wide else None, highlight=False)


def stderr() -> Console:
    """The console for errors, notes and progress (stderr)."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_CONFIG) -> NoReturn:
    """Print `message` in red on stderr and exit with `code`."""
    stderr().print(Text(message, style="red"))
    raise typer.Exit(code)


def flag_error(exc: ValueError) -> typer.BadParameter:
    """A bad flag value from harness.experiment.overrides as click's one-line error: a
    ConfigError's path is the flag to blame; a plain ValueError names the flag itself."""
    if isinstance(exc, ConfigError):
        return typer.BadParameter("\n".join(exc.problems), param_hint=exc.path)
    return typer.BadParameter(str(exc))


def jobs_default() -> int:
    """Worker processes when --jobs is not given: the CPUs, at most 8."""
    return min(os.cpu_count() or 1, 8)


def configs_dir(configs: Path | None) -> Path:
    """`--configs` if given, else ./configs, else the repository's."""
    if configs is not None:
        return configs
    return Path("configs") if Path("configs").is_dir() else REPO_CONFIGS


def load_checked(
    path: Path,
    overrides: dict[str, Any] | None = None,
    grid: dict[str, list[Any]] | None = None,
    limits: SizeLimits | None = None,
) -> ExperimentConfig:
    """Load, validate and check a config's report section, or exit 2 with the message."""
    from harness.experiment.config import DEFAULT_LIMITS, load_config

    try:
        config = load_config(path, overrides=overrides, grid=grid, limits=limits or DEFAULT_LIMITS)
        # Imported only for a valid config: a bad one is reported without the report stack.
        from harness.analysis.runs import check_report

        check_report(config, path)
    except ConfigError as exc:
        fail(str(exc))
    return config


def first_sentence(text: str) -> str:
    """The first sentence of `text` (up to a period, question or exclamation mark followed
    by whitespace or the end), whitespace collapsed; the whole text if it has no such end."""
    import re

    flat = " ".join(text.split())
    match = re.search(r"[.!?](\s|$)", flat)
    return flat[: match.start() + 1] if match else flat


def with_short_help(info: Any) -> Any:
    """A typer CommandInfo with a `short_help`: its own, else its help's first sentence.
    `atomix --help` lists commands by it; without one, typer shows the docstring's whole
    first paragraph with its hard line breaks, so a line stops mid-sentence."""
    if not info.short_help:
        text = info.help or (info.callback.__doc__ if info.callback else "") or ""
        info.short_help = first_sentence(text.split("\n\n")[0])
    return info

