"""What there is to run: `list` (configs, modes, workloads, fault classes) and `validate`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table as RichTable
from rich.text import Text

from harness.cli.common import configs_dir, load_checked, stdout
from harness.cli.options import ConfigArg, Configs, MaxCells, MaxTrials
from harness.errors import ConfigError

commands = typer.Typer()

LIST_KINDS = ("configs", "modes", "workloads", "faults")


def _list_configs(configs: Path) -> RichTable:
    from harness.experiment.config import load_config

    table = RichTable(title=f"configs ({configs})")
    for col in ("name", "file", "description"):
        table.add_column(col)
    for path in sorted([*configs.glob("*.yaml"), *configs.glob("*.yml")]):
        # Each file is validated as `validate` would; a broken one is listed with its first
        # problem instead of stopping the listing.
        try:
            config = load_config(path)
            name, description = config.name or path.stem, config.description.strip()
        except ConfigError as exc:
            more = f" (+{len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
            name, description = path.stem, f"INVALID: {exc.problems[0]}{more}"
        except Exception as exc:  # noqa: BLE001 - listing must not die on one broken file
            name, description = path.stem, f"INVALID: {exc.__class__.__name__}: {exc}"
        table.add_row(Text(name), Text(path.name), Text(description))
    return table


def _list_modes() -> RichTable:
    from harness.modes.registry import modes

    table = RichTable(title="modes")
    for col in ("name", "family", "description"):
        table.add_column(col)
    rank = {"atomix": 0, "baseline": 1, "ablation": 2}
    # sorted() is stable: within a family, modes keep their registry order.
    for info in sorted(modes().values(), key=lambda m: rank.get(m.family, 3)):
        table.add_row(Text(info.name), Text(info.family), Text(info.description))
    return table


def _list_workloads() -> RichTable:
    from harness.workloads import WORKLOADS

    table = RichTable(title="workloads")
    for col in ("name", "description"):
        table.add_column(col)
    # describe() lists a workload it cannot import with the reason instead of failing.
    for name, text in sorted(WORKLOADS.describe()):
        table.add_row(Text(name), Text(text))
    return table


def _list_faults() -> RichTable:
    from harness.world.faults import FAULTS

    table = RichTable(title="fault classes")
    for col in ("class", "where", "description"):
        table.add_column(col)
    for name, spec in FAULTS.items():
        table.add_row(
            Text(str(name)),
            Text(", ".join(sorted(p.value for p in spec.points))),
            Text(spec.description),
        )
    return table


@commands.command("list", epilog="Example: atomix list modes")
def list_(
    what: Annotated[
        str | None,
        typer.Argument(
            metavar="WHAT",
            help="configs, modes, workloads or faults (default: all four).",
            show_default=False,
        ),
    ] = None,
    configs: Configs = None,
) -> None:
    """List experiment configs, modes, workloads and fault classes."""
    if what is not None and what not in LIST_KINDS:
        raise typer.BadParameter(f"{what!r}; allowed: {', '.join(LIST_KINDS)}", param_hint="WHAT")
    makers = {
        "configs": lambda: _list_configs(configs_dir(configs)),
        "modes": _list_modes,
        "workloads": _list_workloads,
        "faults": _list_faults,
    }
    for kind in [what] if what else LIST_KINDS:
        stdout().print(makers[kind]())


@commands.command("validate", epilog="Example: atomix validate configs/synthetic_fault_class.yaml")
def validate(config: ConfigArg, max_cells: MaxCells = None, max_trials: MaxTrials = None) -> None:
    """Validate a config and summarise what it would run."""
    from harness.experiment.overrides import size_limits

    checked = load_checked(config, limits=size_limits(max_cells, max_trials))
    from harness.analysis.runs import summary  # after loading: a bad config needs no pandas

    info = summary(checked)
    table = RichTable(title=f"{config}: valid", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    cells = info["cells"]
    shown = (
        ", ".join(cells)
        if len(cells) <= 12
        else ", ".join(cells[:12]) + f", ... ({len(cells) - 12} more)"
    )
    rows = [
        ("name", info["name"]),
        ("workload", info["workload"]),
        ("modes", ", ".join(info["modes"])),
        ("cells", f"{len(cells)}: {shown}"),
        ("trials", f"{info['trials']} per cell and mode"),
        ("total", f"{info['total']} trials"),
        ("tables", ", ".join(info["tables"])),
    ]
    for key, value in rows:
        table.add_row(key, Text(str(value)))
    stdout().print(table)
