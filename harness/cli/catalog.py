"""What there is to run: `list` (modes, workloads, configs, fault classes) and `validate`."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.table import Table as RichTable
from rich.text import Text

from harness.cli.common import configs_dir, first_sentence, load_checked, stdout
from harness.cli.options import ConfigArg, Configs, MaxCells, MaxTrials
from harness.errors import ConfigError

commands = typer.Typer()

LIST_KINDS = ("modes", "workloads", "configs", "faults")
TITLES = {
    "modes": "Modes",
    "workloads": "Workloads",
    "configs": "Configs",
    "faults": "Fault classes",
}


@dataclass(frozen=True)
class Item:
    """One listed thing: its name, a one-sentence summary, its whole description and any
    facts (`key: value`) its details page shows."""

    name: str
    description: str
    facts: tuple[tuple[str, str], ...] = ()
    group: str = ""  # a heading within the section (a mode's family)
    tag: str = ""  # a short fact shown before the summary (where a fault class strikes)

    @property
    def summary(self) -> str:
        return first_sentence(self.description)


def _configs(configs: Path) -> list[Item]:
    from harness.experiment.config import load_config

    items = []
    for path in sorted([*configs.glob("*.yaml"), *configs.glob("*.yml")]):
        # Each file is validated as `validate` would; a broken one is listed with its first
        # problem instead of stopping the listing.
        try:
            config = load_config(path)
            # Listed by file, the name `atomix run configs/NAME.yaml` takes; the config's own
            # name (its results directory) is a fact when it differs.
            name, description = path.stem, config.description.strip()
            facts: tuple[tuple[str, str], ...] = (("file", str(path)), ("workload", config.workload),
                     ("modes", ", ".join(config.modes)), ("trials", str(config.trials)))  # fmt: skip
            if config.name and config.name != path.stem:
                facts += (("results under", config.name),)
        except ConfigError as exc:
            more = f" (+{len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
            name, description = path.stem, f"INVALID: {exc.problems[0]}{more}"
            facts = (("file", str(path)),)
        except Exception as exc:  # noqa: BLE001 - listing must not die on one broken file
            name, description = path.stem, f"INVALID: {exc.__class__.__name__}: {exc}"
            facts = (("file", str(path)),)
        items.append(Item(name, description or "(no description)", facts))
    return items


def _modes() -> list[Item]:
    from harness.modes.registry import modes

    rank = {"atomix": 0, "baseline": 1, "ablation": 2}
    # sorted() is stable: within a family, modes keep their registry order.
    return [
        Item(info.name, info.description, (("family", info.family),), group=info.family)
        for info in sorted(modes().values(), key=lambda m: rank.get(m.family, 3))
    ]


def _workloads() -> list[Item]:
    from harness.experiment.task_select import _has_tasks
    from harness.workloads import WORKLOADS

    # describe() lists a workload it cannot import with the reason instead of failing.
    return [
        Item(name, text, (("task ids", "yes (--tasks)" if _has_tasks(name) else "no"),
                          ("module", WORKLOADS.entry(name).module)))
        for name, text in sorted(WORKLOADS.describe())
    ]  # fmt: skip


def _faults() -> list[Item]:
    from harness.world.faults import FAULTS

    return [
        Item(str(name), spec.description, (("where", where),), tag=f"[{where}]")
        for name, spec in FAULTS.items()
        for where in [", ".join(sorted(p.value for p in spec.points))]
    ]  # fmt: skip


def fit(text: str, width: int) -> str:
    """`text` in at most `width` characters: whole if it fits, else cut after the last
    clause (at `;`, `,` or `:`) that keeps most of the room, else after the last whole word
    with `…` (the item's details show it whole)."""
    if len(text) <= width:
        return text
    room = text[: width - 1]
    for at in range(len(room) - 1, int(0.7 * width) - 1, -1):
        # A clause ends at a mark outside parentheses, so no "(" is left open.
        if room[at] in ";,:" and room[:at].count("(") == room[:at].count(")"):
            return text[:at]
    word = room.rfind(" ")
    return (text[:word] if word > 0 else room).rstrip(" ,;:") + "…"


def _section(items: list[Item], verbose: bool, width: int) -> RichTable:
    """One line per item (its name, then its tag and summary fitted to the line); a group
    heading, indented, where the group changes."""
    table = RichTable.grid(padding=(0, 2))
    table.add_column(no_wrap=True, style="bold")
    table.add_column(no_wrap=not verbose)
    room = max(20, width - max(len(item.name) for item in items) - 2)
    group = ""
    for item in items:
        if item.group and item.group != group:
            group = item.group
            table.add_row(Text(f"({group})", style="italic"), Text(""))
        text = " ".join(f"{item.tag} {item.summary if not verbose else item.description}".split())
        table.add_row(Text(item.name), Text(text if verbose else fit(text, room)))
    return table


def _details(kind: str, item: Item) -> RichTable:
    table = RichTable.grid(padding=(0, 2))
    table.title = f"{TITLES[kind][:-1] if kind != 'faults' else 'Fault class'} {item.name}"
    table.title_justify = "left"
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    table.add_row("name", Text(item.name))
    for key, value in item.facts:
        table.add_row(key, Text(value))
    table.add_row("description", Text(" ".join(item.description.split())))
    return table


@commands.command(
    "list",
    short_help="List modes, workloads, configs and fault classes.",
    epilog="Example: atomix list modes; atomix list modes tx-full; atomix list --verbose",
)
def list_(
    what: Annotated[
        str | None,
        typer.Argument(
            metavar="[SECTION]",
            help="modes, workloads, configs or faults (default: every section).",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="[NAME]",
            help="One item of SECTION: show its details (e.g. atomix list modes tx-full).",
            show_default=False,
        ),
    ] = None,
    configs: Configs = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Whole descriptions, not first sentences.")
    ] = False,
    pager: Annotated[
        bool,
        typer.Option(
            "--pager/--no-pager",
            help="Page a listing taller than the terminal (only when stdout is a terminal).",
        ),
    ] = True,
) -> None:
    """List what there is to run, grouped in sections (modes, workloads, configs, fault
    classes), one line per item; `atomix list SECTION NAME` shows one item in full."""
    if what is not None and what not in LIST_KINDS:
        from harness.registry import did_you_mean

        raise typer.BadParameter(
            f"unknown section {what!r}{did_you_mean(what, LIST_KINDS)}; allowed: "
            f"{', '.join(LIST_KINDS)}",
            param_hint="SECTION",
        )
    makers = {
        "configs": lambda: _configs(configs_dir(configs)),
        "modes": _modes,
        "workloads": _workloads,
        "faults": _faults,
    }
    console = stdout()
    if name is not None:
        assert what is not None  # typer fills SECTION before NAME
        by_name = {item.name: item for item in makers[what]()}
        if name not in by_name:
            from harness.registry import did_you_mean

            raise typer.BadParameter(
                f"no {what[:-1] if what != 'faults' else 'fault class'} {name!r}"
                f"{did_you_mean(name, list(by_name))}; allowed: {', '.join(by_name)}",
                param_hint="NAME",
            )
        console.print(_details(what, by_name[name]))
        return
    parts: list[Any] = []
    for kind in [what] if what else LIST_KINDS:
        items = makers[kind]()
        parts.append(Text(f"{TITLES[kind]} ({len(items)})", style="bold underline"))
        parts.append(_section(items, verbose, console.width))
        parts.append(Text(""))
    hint = "Details: atomix list SECTION NAME (e.g. atomix list modes tx-full)"
    parts.append(Text(hint + ("" if verbose else "; whole descriptions: --verbose"), style="dim"))
    group = Group(*parts)
    if pager and sys.stdout.isatty() and _height(console, group) > console.height:
        with console.pager(styles=True):
            console.print(group)
        return
    console.print(group)


def _height(console: Any, renderable: Any) -> int:
    return len(console.render_lines(renderable, pad=False))


@commands.command(
    "validate",
    short_help="Validate a config and summarise what it would run.",
    epilog="Example: atomix validate configs/synthetic_fault_class.yaml")
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
