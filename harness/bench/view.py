"""Page loads of `atomix view` on a large run: figures with their target.

`python -m harness.bench.view [--trials-per-cell N] [--browser]` runs configs/tau_retail.yaml
with N trials per cell and mode (default 834: 3 cells x 8 modes x 834 = 20,016 trials) into a
temporary results directory, times the run page's analysis alone in this process (records
frame, every table and the paired verdicts: `analysis_figure`), then times each page as
served over HTTP by the real app
(uvicorn on 127.0.0.1): the first load (cold: the run's trials are read and its tables built)
and the median of the next five (warm). With `--browser`, also the time headless Chromium
takes to load each page to its `load` event (the plots drawn), when Chromium is installed.
Target: every page under 2 s. Nothing here is a test: the test suite times nothing, and every
figure depends on the machine and its load.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import statistics
import tempfile
import threading
import time
import urllib.parse
import urllib.request
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
        verdict_block(records, config)
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


def page_figures(per_cell: int = 834, browser: bool = False) -> list[Figure]:
    import uvicorn

    from harness.view.app import create_app

    tmp = Path(tempfile.mkdtemp(prefix="atomix-bench-view-"))
    try:
        started = time.perf_counter()
        run_dir = _run(tmp, per_cell)
        n = sum(1 for _ in (run_dir / "trials.jsonl").open("rb"))
        print(f"run of {n:,} trials made in {time.perf_counter() - started:.1f} s: {run_dir}")
        analysis = analysis_figure(run_dir)
        port = _free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(tmp), host="127.0.0.1", port=port,
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        run_id = urllib.parse.quote(run_dir.relative_to(tmp).as_posix(), safe="")
        figures = [analysis]
        # Cold, in the order a reader goes: the first trials page reads the whole run.
        cold_s: dict[str, float] = {}
        pages = {"runs": "/", "trials (not clean)": f"/trials?run={run_id}&outcome=not+clean"}
        for name, path in pages.items():
            cold_s[name], listing = _get(base + path)
        pages["trials (saga, F2)"] = f"/trials?run={run_id}&mode=saga&fault=F2"
        key = re.search(r'href="/trial\?run=[^&]+&amp;key=([^"]+)"', listing)
        if key:
            pages["trial"] = f"/trial?run={run_id}&key={key.group(1)}"
            cold_s["trial"], trial_html = _get(base + pages["trial"])
            link = re.search(r'href="(/compare\?[^"]+)"', trial_html)
            if link:
                pages["side by side"] = link.group(1).replace("&amp;", "&")
        # The run page shows at once; its tables are built in the background and polled for.
        pages["run"] = f"/run?run={run_id}"
        start = time.perf_counter()
        cold_s["run"], html = _get(base + pages["run"])
        while 'id="tables-pending"' in html:
            time.sleep(0.2)
            html = _get(base + pages["run"])[1]
        figures.append(Figure("view run: tables, verdicts and plots ready after",
                              time.perf_counter() - start, "s", "(no target: built once per change)", None))
        for name, path in pages.items():
            cold = cold_s.get(name)
            if cold is None:
                cold, _ = _get(base + path)
            warm = statistics.median(_get(base + path)[0] for _ in range(5))
            figures.append(Figure(f"view {name}: first load", cold, "s", f"< {TARGET_S:g} s",
                                  cold < TARGET_S))
            figures.append(Figure(f"view {name}: warm load (median of 5)", warm, "s",
                                  f"< {TARGET_S:g} s", warm < TARGET_S))
        if browser:
            figures += _browser_figures(base, pages)
        server.should_exit = True
        thread.join(10)
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
    parser.add_argument("--trials-per-cell", type=int, default=834)
    parser.add_argument("--browser", action="store_true")
    args = parser.parse_args(argv)
    figures = page_figures(args.trials_per_cell, args.browser)
    print_figures(figures)
    return 0 if all(f.met is not False for f in figures) else 1


if __name__ == "__main__":
    raise SystemExit(main())
