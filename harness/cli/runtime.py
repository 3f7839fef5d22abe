"""The runtime's own commands: `recover` a durable log, and `mcp-proxy`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from harness.cli.common import fail, stdout

commands = typer.Typer()

# `recover`: something is pending or needs a human.
EXIT_UNFINISHED = 1


@commands.command(
    "recover",
    short_help="Finish or abort what a dead program left in its durable log.",
    epilog=(
        "Examples: atomix recover ./atomix-log; atomix recover --status ./atomix-log --json; "
        "atomix recover --coordinator postgresql://atomix@db/atomix; "
        "atomix recover --status --coordinator postgresql://atomix@db/atomix"
    ),
    help=(
        "Finish the committed transactions a dead program left in its durable log (each "
        "missing effect delivered once, by key), abort the rest, retry failed deliveries, "
        "and say what needs a human."
        "\n\n"
        "Effects of the built-in adapters (files, SQLite rows, mail) are redone from the log "
        "alone; a user tool's effect needs the program's tools: it is reported as pending, and "
        "the program finishes it with rt.recover(). A record that cannot be decoded is "
        "quarantined and reported; the rest recovers. A log whose database or WAL file was lost "
        "is refused."
        "\n\n"
        "--status only reads the log (also while a live program holds it): what is pending, "
        "which failed deliveries wait for a retry, the dead letters and the quarantine. "
        "--status --coordinator postgresql://... does so for every log kept in that "
        "coordinator's database (Runtime(log=\"coordinator\"))."
        "\n\n"
        "--coordinator URL (instead of LOGDIR): fence the processes of that coordinator whose "
        "lease expired (never one whose log is still held), take over their transactions from "
        "their logs, and leave; with a postgresql:// coordinator, then recover and remove the "
        "finished logs in its database that no live process holds. Exit 1 if a fenced "
        "process could not be recovered or a log still holds work."
        "\n\n"
        "Exit codes: 0 nothing left to do; 1 something is pending, retried, dead or needs a "
        "human (with --status: the log holds any of these; with --coordinator: any log does); "
        "2 no usable log at LOGDIR (missing, lost, corrupt), or it is in use by a live "
        "process, or a bad or unreachable --coordinator URL."
    ),
)
def recover(
    logdir: Annotated[
        Path | None,
        typer.Argument(
            metavar="LOGDIR",
            help="The durable log's directory (what the program passed as Runtime(log=...)).",
            show_default=False,
        ),
    ] = None,
    status: Annotated[
        bool,
        typer.Option("--status", help="Only list what the log holds; change nothing."),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="With --status: print it as JSON."),
    ] = False,
    coordinator: Annotated[
        str | None,
        typer.Option(
            "--coordinator",
            metavar="URL",
            help="Instead of one LOGDIR: take over the transactions of every dead process of "
            "this coordinator (sqlite:///PATH or postgresql://...), from their logs. With "
            "--status: list the logs kept in its database (postgresql://... only).",
            show_default=False,
        ),
    ] = None,
    lease: Annotated[
        float,
        typer.Option("--lease", help="With --coordinator: seconds without a heartbeat after "
                     "which a process is taken for dead (its log still held: never)."),
    ] = 30.0,
) -> None:
    """Recover a durable log (see the command's help)."""
    from atomix.log import LogError
    from atomix.log_status import read_status
    from atomix.recovery import recover as recover_log

    if coordinator is not None:
        if logdir is not None:
            fail("atomix recover: --coordinator URL goes without LOGDIR")
        if status:
            _status_coordinator(coordinator, as_json)
            return
        if as_json:
            fail("atomix recover: --json goes with --status (recovery itself prints a report)")
        _recover_coordinator(coordinator, lease)
        return
    if logdir is None:
        fail("atomix recover: missing LOGDIR (or --coordinator URL)")
    if as_json and not status:
        fail("atomix recover: --json goes with --status (recovery itself prints a report)")
    if status:
        try:
            found = read_status(logdir)
        except LogError as exc:
            fail(f"atomix recover --status: {exc}")
        if as_json:
            typer.echo(json.dumps(found.data(), indent=2, sort_keys=True))
        else:
            for line in found.lines():
                stdout().print(Text(line), soft_wrap=True)
        if not found.empty:
            raise typer.Exit(EXIT_UNFINISHED)
        return
    try:
        report = recover_log(logdir)
    except LogError as exc:
        fail(f"atomix recover: {exc}")
    for line in report.lines():
        stdout().print(Text(line), soft_wrap=True)
    if not report.clean:
        raise typer.Exit(EXIT_UNFINISHED)


def _status_coordinator(url: str, as_json: bool) -> None:
    """`--status --coordinator URL`: every log in the coordinator's database, read-only."""
    from atomix.coordinator import CoordinatorError
    from atomix.coordinator.db_log_admin import log_statuses

    if not url.startswith(("postgresql://", "postgres://")):
        fail(
            f"atomix recover --status --coordinator: {url!r} is not allowed: logs are kept in a "
            "coordinator's database only with 'postgresql://USER@HOST/DB' (Runtime(log="
            "\"coordinator\")); a log directory's status is atomix recover --status LOGDIR"
        )
    try:
        found = log_statuses(url)
    except (CoordinatorError, ValueError) as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps({"logs": [s.data() for s in found]}, indent=2, sort_keys=True))
    else:
        if not found:
            stdout().print(Text("no log in the coordinator's database"))
        for i, each in enumerate(found):
            for line in ([""] if i else []) + each.lines():
                stdout().print(Text(line), soft_wrap=True)
    if any(not s.empty for s in found):
        raise typer.Exit(EXIT_UNFINISHED)


def _recover_coordinator(url: str, lease: float) -> None:
    from atomix.coordinator import CoordinatorError, recover_coordinator
    from atomix.coordinator.db_log_admin import SweptLog
    from atomix.log import LogError

    if not lease > 0:
        fail(f"atomix recover: --lease must be > 0 seconds, got {lease}")
    swept: list[SweptLog] = []
    try:
        done, left = recover_coordinator(url, lease=lease, swept=swept)
    except (CoordinatorError, LogError) as exc:
        fail(f"atomix recover --coordinator: {exc}")
    for found in done:
        how = "its log recovered" if found.compensated else "no log: settled without compensating"
        stdout().print(
            Text(f"member {found.member}: {len(found.txids)} transaction(s) settled ({how})"),
            soft_wrap=True,
        )
    for member in left:
        stdout().print(
            Text(f"member {member.id} (pid {member.pid} on {member.host}): fenced, not recovered: "
                 f"its log {member.log_dir} is in use or needs its program's tools"),
            soft_wrap=True,
        )
    if not done and not left:
        stdout().print(Text("no dead process to recover"))
    for log in swept:
        stdout().print(Text(log.line()), soft_wrap=True)
    if left or any(log.needs_work for log in swept):
        raise typer.Exit(EXIT_UNFINISHED)


@commands.command(
    "mcp-proxy",
    short_help="Serve MCP, settling another server's tool calls atomically.",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="--policy POLICY.yaml [--log DIR] [--coordinator URL] -- SERVER_COMMAND...",
    epilog="Example: atomix mcp-proxy --policy policy.yaml -- python my_server.py --flag",
    help=(
        "Serve MCP on stdin/stdout in front of another MCP server (the command after `--`), "
        "settling its tool calls in Atomix transactions as POLICY says: irreversible calls "
        "wait at a gate until commit, reversible ones are compensated at abort."
        "\n\n"
        "Exit codes: 0 the client disconnected; 2 a bad policy (or one that does not fit the "
        "server's tools), or the server did not start; 128+N stopped by signal N (after "
        "settling as on_session_end says). See docs/mcp-proxy.md."
    ),
)
def mcp_proxy(
    ctx: typer.Context,
    policy: Annotated[
        Path,
        typer.Option(
            "--policy", metavar="POLICY.yaml", help="The proxy's policy file.", show_default=False
        ),
    ],
    log: Annotated[
        str | None,
        typer.Option(
            "--log",
            metavar="DIR|coordinator",
            help="A durable transaction log directory (Runtime(log=DIR)), or 'coordinator' to "
            "keep it in the --coordinator's PostgreSQL database (./coordinator for a directory "
            "of that name).",
            show_default=False,
        ),
    ] = None,
    coordinator: Annotated[
        str | None,
        typer.Option(
            "--coordinator",
            metavar="URL",
            help="Share a coordinator (sqlite:///PATH or postgresql://...) with other proxies: "
            "their tool calls isolate against each other's.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Front an MCP server with transactional tool calls (see the command's help)."""
    from atomix.integrations.mcp import PolicyError, ProxyStartError, load_policy, run_proxy

    command = list(ctx.args)
    if not command:
        fail(
            "atomix mcp-proxy: no upstream server command; put it after `--`: "
            "atomix mcp-proxy --policy POLICY.yaml -- SERVER_COMMAND..."
        )
    try:
        log_dir = None if log is None else log if log == "coordinator" else Path(log)
        code = run_proxy(load_policy(policy), policy, command, log_dir=log_dir, coordinator=coordinator)
    except (PolicyError, ProxyStartError) as exc:
        fail(f"atomix mcp-proxy: {exc}")
    raise typer.Exit(code)
