"""The runtime's own commands: `recover` a durable log, and `mcp-proxy`."""

from __future__ import annotations

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
    epilog="Example: atomix recover ./atomix-log",
    help=(
        "Finish the committed transactions a dead program left in its durable log (each "
        "missing effect delivered once, by key), abort the rest, and say what needs a human."
        "\n\n"
        "Effects of the built-in adapters (files, SQLite rows, mail) are redone from the log "
        "alone; a user tool's effect needs the program's tools: it is reported as pending, and "
        "the program finishes it with rt.recover()."
        "\n\n"
        "Exit codes: 0 nothing left to do; 1 something is pending or needs a human; 2 no usable "
        "log at LOGDIR, or it is in use by a live process."
    ),
)
def recover(
    logdir: Annotated[
        Path,
        typer.Argument(
            metavar="LOGDIR",
            help="The durable log's directory (what the program passed as Runtime(log=...)).",
            show_default=False,
        ),
    ],
) -> None:
    """Recover a durable log (see the command's help)."""
    from atomix.log import LogError
    from atomix.recovery import recover as recover_log

    try:
        report = recover_log(logdir)
    except LogError as exc:
        fail(f"atomix recover: {exc}")
    for line in report.lines():
        stdout().print(Text(line), soft_wrap=True)
    if not report.clean:
        raise typer.Exit(EXIT_UNFINISHED)


@commands.command(
    "mcp-proxy",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="--policy POLICY.yaml [--log DIR] -- SERVER_COMMAND...",
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
        Path | None,
        typer.Option(
            "--log",
            metavar="DIR",
            help="A durable transaction log directory (Runtime(log=DIR)).",
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
        code = run_proxy(load_policy(policy), policy, command, log_dir=log)
    except (PolicyError, ProxyStartError) as exc:
        fail(f"atomix mcp-proxy: {exc}")
    raise typer.Exit(code)
