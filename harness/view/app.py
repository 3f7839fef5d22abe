"""The `atomix view` web app: Starlette routes over a `ResultsIndex`, Jinja2 templates.

Pages (every one a plain GET with its state in the query string, so a URL names a view and
the browser's back button works):

- `/`                      the runs: filterable and sortable, refreshed while any run writes;
- `/run?run=ID`            a run's tables with intervals, its paired verdicts, its plots;
- `/trials?run=ID&...`     its trials, filtered by mode, cell, outcome, fault class, task;
- `/trial?run=ID&key=K`    one trial's timeline, verdict and diff against the goal;
- `/compare?run=ID&cell=C&trial=T&a=M1&b=M2`  one task under two modes, aligned.

Static files are served from this package (`static/`) and from the installed packages that
ship the front end's JavaScript (htmx, plotly): nothing is fetched from the network.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from harness.view import pages
from harness.view.data import ResultsIndex, ViewError

__all__ = ["VENDOR", "create_app", "vendor_file"]

HERE = Path(__file__).resolve().parent

#: JavaScript the pages use, each from the installed package that ships it: URL name ->
#: (package, path inside it).
VENDOR: dict[str, tuple[str, str]] = {
    "htmx.min.js": ("js_lib_htmx", "static/htmx/htmx.min.js"),
    "plotly.min.js": ("plotly", "package_data/plotly.min.js"),
}


def vendor_file(name: str) -> Path:
    """The file of vendor asset `name` inside its installed package (ViewError when the
    package is not installed: `pip install atomix-tx` brings both)."""
    package, inner = VENDOR[name]
    try:
        path = Path(str(resources.files(package).joinpath(inner)))
    except ModuleNotFoundError:
        raise ViewError(f"{name}: package {package!r} is not installed (pip install atomix-tx)") from None
    if not path.is_file():
        raise ViewError(f"{name}: {inner} is missing from the installed package {package!r}")
    return path


def _fmt_num(value: Any, digits: int = 1) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _url(path: str, **params: Any) -> str:
    query = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{path}?{urlencode(query)}" if query else path


def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _fmt_num
    env.globals["url"] = _url
    return env


def create_app(root: Path, *, poll_s: float = 2.0, prefetch: bool = True) -> Starlette:
    """The app over the runs under `root` (a results directory, a config's directory or a
    run). `poll_s`: how often a page showing a running run asks for news; `prefetch`: read
    every run's trials in the background as the server starts."""
    index = ResultsIndex(root)
    env = _env()
    env.globals["poll_ms"] = int(poll_s * 1000)
    env.globals["root"] = str(index.root)

    def render(name: str, request: Request, http_status: int = 200, **context: Any) -> HTMLResponse:
        context["request"] = request
        context["partial"] = request.headers.get("HX-Request") == "true"
        html = env.get_template(name).render(**context)
        return HTMLResponse(html, status_code=http_status)

    def page(handler: Callable[[Request, ResultsIndex], tuple[str, dict[str, Any]]]) -> Any:
        async def endpoint(request: Request) -> Response:
            try:
                name, context = handler(request, index)
            except ViewError as exc:
                return render("error.html", request, http_status=404, message=str(exc))
            return render(name, request, **context)

        return endpoint

    async def vendor(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in VENDOR:
            return Response("not found", status_code=404)
        try:
            path = vendor_file(name)
        except ViewError as exc:
            return Response(str(exc), status_code=500)
        return FileResponse(path, media_type="text/javascript",
                            headers={"Cache-Control": "max-age=86400"})

    routes = [
        Route("/", page(pages.runs_page)),
        Route("/run", page(pages.run_page)),
        Route("/trials", page(pages.trials_page)),
        Route("/trial", page(pages.trial_page)),
        Route("/compare", page(pages.compare_page)),
        Route("/vendor/{name}", vendor),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if prefetch:
            # The newest run is what a reader opens first: its tables are built as soon as
            # its trials are read.
            index.prefetch(then=lambda run_id: pages.start_tables(index, run_id))
        yield

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.index = index
    return app
