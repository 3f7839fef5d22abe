"""Page loads of `atomix view` on a large run: figures with their target.

`python -m harness.bench.view [--trials-per-cell N | --run DIR] [--browser]` runs
configs/tau_retail.yaml with N trials per cell and mode (default 834: 3 cells x 8 modes x 834 =
20,016 trials) into a temporary results directory, or takes an existing run (`--run`: a run
directory, or a results directory whose newest run is taken; nothing is written to it). It
times the run page's analysis alone in this process (records frame, every table and the
paired verdicts: `analysis_figure`), then times each page as served over HTTP by
`atomix view` itself, started as its own process on 127.0.0.1:

- first load: each page is the first request to a freshly started server (nothing read,
  parsed, built or imported on demand yet; the clock starts once the server accepts
  connections, as a reader's browser would find it);
- warm load: the median of five loads from one server that has served every page once.

The run page shows at once and fetches its tables when they are built; "ready after" is the
time from its first request until they are shown. With `--browser`, also the time headless
Chromium takes to load each page to its `load` event (the plots drawn), when Chromium is
installed. Target: every page under 2 s. Nothing here is a test: the test suite times
nothing, and every figure depends on the machine and its load (the 1-minute load average is
printed with the figures).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from harness.bench.figures import Figure, print_figures
from harness.bench.trials import configs_dir

TARGET_S = 2.0


def _run(out: Path, per_cell: int) -> Path:
    from harness.experiment.config import load_config
    from harness.experiment.runner import run

    config = load_config(configs_dir() / "tau_retail.yaml", overrides={"trials": per_cell})
    result = run(config, out=out, jobs=1)
    return Path(result.run_dir)


def analysis_figure(run_dir: Path, repeat: int = 3) -> Figure:
    """The run page's analysis alone, in this process: the records frame, every table of the
    run's config and its paired verdicts (what `atomix report` and the run page build), the
    median of `repeat` builds; reading trials.jsonl is not counted."""
    import json

    from harness.analysis.records import records_frame
    from harness.analysis.runs import load_run, table_specs
    from harness.analysis.table import build_table
    from harness.analysis.verdicts import verdict_block

    config = load_run(run_dir).config
    with (run_dir / "trials.jsonl").open("rb") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        df = records_frame(records)
        for spec in table_specs(config):
            build_table(df, spec)
        verdict_block(records, config, frame=df)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return Figure(f"view run: records frame, tables and verdicts of {len(records):,} trials "
                  f"(median of {repeat})", median, "s", f"< {TARGET_S:g} s", median < TARGET_S)


def _get(url: str) -> tuple[float, str]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read().decode("utf-8")
    return time.perf_counter() - start, body


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    """A started `atomix view`: its base URL and process id."""

    def __init__(self, base: str, pid: int) -> None:
        self.base, self.pid = base, pid

    def cpu_s(self) -> float | None:
        """CPU seconds the server has used so far, every thread (None off Linux): a figure
        that a loaded machine skews less than the wall time."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _server(root: Path) -> Iterator[_Server]:
    """`atomix view ROOT` in a process of its own, once it accepts connections (probed
    without a request, so the first request timed is the first it serves)."""
    port = _free_port()
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cli import app; app(prog_name='atomix')", "view", str(root),
         "--port", str(port), "--no-browser"],
        cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"atomix view {root} exited with {proc.returncode}: {err}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"atomix view {root} did not listen on port {port} in 120 s")
            time.sleep(0.02)
        yield _Server(f"http://127.0.0.1:{port}", proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _newest_run(root: Path) -> Path:
    from harness.view.data import ResultsIndex

    dirs = ResultsIndex(root).run_dirs()
    if not dirs:
        raise SystemExit(f"--run {root}: no run directory (one with a manifest.json) in it")
    return max(dirs, key=lambda d: d.stat().st_mtime)


def _wait_tables(base: str, path: str, html: str) -> str:
    # The run page shows at once; its tables are built in the background and polled for.
    while 'id="tables-pending"' in html:
        time.sleep(0.1)
        html = _get(base + path)[1]
    return html


def _pages(base: str, run_id: str) -> dict[str, str]:
    """The pages timed, in the order a reader goes, with a trial and a side-by-side found
    by following the links of the pages before (from one server, `base`)."""
    pages = {"runs": "/", "run": f"/run?run={run_id}",
             "trials (not clean)": f"/trials?run={run_id}&outcome=not+clean",
             "trials (saga, F2)": f"/trials?run={run_id}&mode=saga&fault=F2"}
    _, listing = _get(base + pages["trials (not clean)"])
    key = re.search(r'href="/trial\?run=[^&]+&amp;key=([^"]+)"', listing)
    if key:
        pages["trial"] = f"/trial?run={run_id}&key={key.group(1)}"
        _, trial_html = _get(base + pages["trial"])
        link = re.search(r'href="(/compare\?[^"]+)"', trial_html)
        if link:
            pages["side by side"] = link.group(1).replace("&amp;", "&")
    return pages


def page_figures(per_cell: int = 834, browser: bool = False, run: Path | None = None) -> list[Figure]:
    tmp = Path(tempfile.mkdtemp(prefix="atomix-bench-view-"))
    try:
        if run is None:
            started = time.perf_counter()
            run_dir = _run(tmp, per_cell)
            print(f"run made in {time.perf_counter() - started:.1f} s")
            root = tmp
        else:
            root = run.resolve()  # served as given (a run alone has the run id ".")
            run_dir = _newest_run(root)
        n = sum(1 for _ in (run_dir / "trials.jsonl").open("rb"))
        print(f"run of {n:,} trials: {run_dir}")
        run_id = urllib.parse.quote(run_dir.relative_to(root).as_posix(), safe="")
        figures = [analysis_figure(run_dir)]
        with _server(root) as server:
            base = server.base
            pages = _pages(base, run_id)
            _wait_tables(base, pages["run"], _get(base + pages["run"])[1])
            for path in pages.values():
                _get(base + path)
            warm = {name: statistics.median(_get(base + path)[0] for _ in range(5))
                    for name, path in pages.items()}
            if browser:
                browser_figures = _browser_figures(base, pages)
        for name, path in pages.items():
            with _server(root) as server:
                cpu0 = server.cpu_s()
                cold, html = _get(server.base + path)
                cpu1 = server.cpu_s()
                if name == "run":
                    start = time.perf_counter() - cold
                    _wait_tables(server.base, path, html)
                    ready = time.perf_counter() - start
                    cpu_ready = server.cpu_s()
            figures.append(Figure(f"view {name}: first load (fresh server)", cold, "s",
                                  f"< {TARGET_S:g} s", cold < TARGET_S))
            if cpu0 is not None and cpu1 is not None:
                figures.append(Figure(f"view {name}: server CPU until the first load", cpu1 - cpu0,
                                      "s", "-", None))
            if name == "run":
                figures.append(Figure("view run: tables, verdicts and plots shown after (fresh "
                                      "server)", ready, "s", f"< {TARGET_S:g} s", ready < TARGET_S))
                if cpu0 is not None and cpu_ready is not None:
                    figures.append(Figure("view run: server CPU until its tables are shown",
                                          cpu_ready - cpu0, "s", "-", None))
            figures.append(Figure(f"view {name}: warm load (median of 5)", warm[name], "s",
                                  f"< {TARGET_S:g} s", warm[name] < TARGET_S))
        if browser:
            figures += browser_figures
        return figures
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _browser_figures(base: str, pages: dict[str, str]) -> list[Figure]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        print("(no chromium/chromedriver: browser load times skipped)")
        return []
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    out = []
    try:
        for name, path in pages.items():
            times = []
            for _ in range(3):
                start = time.perf_counter()
                driver.get(base + path)  # returns at the load event
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            out.append(Figure(f"view {name}: browser load (median of 3)", median, "s",
                              f"< {TARGET_S:g} s", median < TARGET_S))
    finally:
        driver.quit()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials-per-cell", type=int, default=834,
                        help="trials per cell and mode of the run made (default 834: 20,016 trials)")
    parser.add_argument("--run", type=Path, default=None, metavar="DIR",
                        help="time an existing run instead of making one: a run directory, or a "
                        "results directory (its newest run); it is only read")
    parser.add_argument("--browser", action="store_true",
                        help="also time headless Chromium loading each page (needs chromium)")
    args = parser.parse_args(argv)
    if args.run is not None and not args.run.is_dir():
        parser.error(f"--run {args.run}: no such directory (give a run or a results directory)")
    figures = page_figures(args.trials_per_cell, args.browser, args.run)
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print_figures(figures)
    return 0 if all(f.met is not False for f in figures) else 1


if __name__ == "__main__":
    raise SystemExit(main())
