"""`atomix view`: browse runs, tables, trials and timelines in a local web page."""

from __future__ import annotations

import socket
import threading
import webbrowser
from pathlib import Path
from typing import Annotated

import typer

from harness.cli.common import fail, stdout

commands = typer.Typer()

#: The port `atomix view` tries first; the next free one is taken when it is busy.
DEFAULT_PORT = 8765


def _free_port(host: str, first: int, tries: int = 20) -> int:
    for port in range(first, first + tries):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    fail(f"--port: ports {first}..{first + tries - 1} on {host} are all in use; give another")


@commands.command(
    "view",
    short_help="Browse runs, tables and trial timelines in a local web page.",
    epilog="Example: atomix view results   (or a run: atomix view results/tau_retail/<run-id>)",
)
def view(
    path: Annotated[
        Path,
        typer.Argument(
            metavar="[RESULTS_DIR|RUN]",
            help="A results directory (as given to `atomix run --out`), a config's directory "
            "or one run directory.",
            show_default=False,
        ),
    ] = Path("results"),
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, max=65535,
                     help=f"Port to serve on (default: {DEFAULT_PORT}, or the next free one)."),
    ] = None,
    host: Annotated[
        str,
        typer.Option("--host", help="Address to listen on; the default serves this machine only."),
    ] = "127.0.0.1",
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Do not open a web browser; print the address.")
    ] = False,
) -> None:
    """Serve a local web app over a results directory: runs, a run's tables with intervals,
    paired verdicts and interactive plots, its trials filtered by mode, cell, outcome, fault
    and task, one trial's timeline with its diff against the goal, and two modes side by
    side on the same trial. Pages read the files on each request, so a run that is still
    writing shows its new trials. Stop with Ctrl-C."""
    if not path.exists():
        fail(f"{path}: no such directory (give a results directory, a config's directory or a "
             "run; `atomix runs` lists them)")
    if not path.is_dir():
        fail(f"{path}: not a directory (give a results directory or a run directory)")
    # Imported here: the web stack costs nothing to commands that do not serve pages.
    import uvicorn

    from harness.experiment.interrupts import set_note
    from harness.view.app import create_app
    from harness.view.data import ViewError

    try:
        app = create_app(path)
    except ViewError as exc:
        fail(str(exc))
    if port is None:
        port = _free_port(host, DEFAULT_PORT)
    else:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError as exc:
                fail(f"--port: cannot listen on {host}:{port} ({exc.strerror or exc})")
    # A signal before uvicorn takes over stops a server, not a run: say so, not "nothing
    # was written" about a run that never existed.
    set_note("stopped the view server")
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    address = f"http://{shown}:{port}/"
    stdout().print(f"atomix view: serving {path.resolve()} at {address} (Ctrl-C to stop)",
                   soft_wrap=True)
    if not no_browser:
        threading.Timer(0.8, lambda: webbrowser.open(address)).start()
    uvicorn.run(app, host=host, port=port, log_level="warning")
