"""What each page of `atomix view` shows, as (template, context) from a request.

Tables, verdicts and plot data of a run are rebuilt from its stored records with the same
code `atomix report` uses (`harness.analysis`), cached until trials.jsonl grows.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from starlette.requests import Request

from harness.analysis.records import records_frame
from harness.analysis.runs import main_table, overrides_caption, table_specs
from harness.analysis.table import Table, build_table
from harness.analysis.verdicts import VerdictBlock, verdict_block
from harness.experiment.cells import cell_id, expand_cells
from harness.experiment.config import ConfigError, ExperimentConfig, validate_config
from harness.experiment.rundir import read_manifest
from harness.view.data import OUTCOMES, ResultsIndex, TrialRow, ViewError, filter_rows
from harness.view.timeline import align, trial_view

#: Tables of a large run take a while to build: the run page waits this long for them,
#: then shows itself at once and fetches them when ready (htmx polls).
TABLES_WAIT_S = 1.0
_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="atomix-view-tables")

#: Trials listed per page (the count of matches is always whole).
PAGE_SIZE = 100
FAULT_FILTERS: tuple[str, ...] = ("any", "none", "F1", "F2", "F3", "F4", "F5")
RUN_SORTS: tuple[str, ...] = ("started", "config", "trials", "progress", "status", "wall")


def _q(request: Request, name: str, default: str = "") -> str:
    return str(request.query_params.get(name, default)).strip()


def _run_id(request: Request) -> str:
    run = _q(request, "run")
    if not run:
        raise ViewError("no run given (open one from the runs page)")
    return run


# --------------------------------------------------------------------------- runs


def runs_page(request: Request, index: ResultsIndex) -> tuple[str, dict[str, Any]]:
    rows, problems = index.runs()
    text = _q(request, "q").lower()
    if text:
        rows = [r for r in rows if text in " ".join(
            (r.config, r.run_id, r.workload, r.agent, r.status, r.overrides, r.sweep,
             r.revision, " ".join(r.modes))).lower()]
    status = _q(request, "status")
    if status:
        rows = [r for r in rows if r.status == status]
    sort = _q(request, "sort", "started")
    if sort not in RUN_SORTS:
        sort = "started"
    desc = _q(request, "order", "desc") != "asc"
    keys = {
        "started": lambda r: (r.started_at, r.run_id),
        "config": lambda r: (r.config, r.started_at),
        "trials": lambda r: (r.done, r.run_id),
        "progress": lambda r: (r.progress, r.run_id),
        "status": lambda r: (r.status, r.run_id),
        "wall": lambda r: (r.wall_s if r.wall_s is not None else -1.0, r.run_id),
    }
    rows.sort(key=keys[sort], reverse=desc)
    live = any(r.status == "running" for r in rows)
    statuses = sorted({r.status for r in index.runs()[0]})
    return "runs.html", {"runs": rows, "problems": problems, "q": _q(request, "q"),
                         "status": status, "statuses": statuses, "sort": sort, "desc": desc,
                         "live": live, "sorts": RUN_SORTS}


# --------------------------------------------------------------------------- one run


def _config(index: ResultsIndex, run_id: str) -> tuple[dict[str, Any], ExperimentConfig]:
    run_dir = index.run_dir(run_id)
    manifest = read_manifest(run_dir)
    try:
        config = validate_config(manifest["config"], run_dir / "manifest.json")
    except ConfigError as exc:
        raise ViewError(f"{run_dir}: its stored config no longer validates: {exc}") from None
    return manifest, config


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _plot_data(table: Table) -> dict[str, Any]:
    """One bar trace per row (mode) over the table's columns (cells), with the interval as
    error bars and, for hover: the cell, N, the interval and the trials counted."""
    d = table.data
    scale = 100.0 if table.spec.kind == "proportion" else 1.0
    traces = []
    for row in dict.fromkeys(d["row"].tolist()):
        sub = d[d["row"] == row]
        xs, ys, lo, hi, custom = [], [], [], [], []
        for _, r in sub.iterrows():
            value = _finite(r["value"])
            xs.append(str(r["column"]))
            ys.append(None if value is None else value * scale)
            lo_v, hi_v = _finite(r["lo"]), _finite(r["hi"])
            lo.append(0.0 if value is None or lo_v is None else (value - lo_v) * scale)
            hi.append(0.0 if value is None or hi_v is None else (hi_v - value) * scale)
            custom.append([str(r["column"]), int(r["n"]), str(r["text"]),
                           _fmt_interval(lo_v, hi_v, scale), _fmt_total(r, table), str(row)])
        traces.append({"name": str(row), "x": xs, "y": ys, "lo": lo, "hi": hi, "custom": custom})
    unit = "%" if table.spec.kind == "proportion" else table.spec.metric
    return {"traces": traces, "title": table.title, "unit": unit, "metric": table.spec.metric,
            "rows": table.spec.rows}


def _fmt_interval(lo: float | None, hi: float | None, scale: float) -> str:
    if lo is None or hi is None:
        return "no interval"
    return f"[{lo * scale:.3g}, {hi * scale:.3g}]"


def _fmt_total(r: Any, table: Table) -> str:
    total = _finite(r["total"])
    if total is None:
        return ""
    if table.spec.kind == "proportion":
        return f"{int(total)} of {int(r['n'])} trials"
    return f"sum {total:g} over {int(r['n'])} trials"


def _build_tables(index: ResultsIndex, run_id: str) -> dict[str, Any]:
    """The run page's tables, verdicts and plot data, from the run's records as they are now
    (each record parsed once: the index keeps them; one frame serves every table)."""
    manifest, config = _config(index, run_id)
    trials, _, records = index.snapshot(run_id)
    if manifest.get("status") != "running":
        index.let_go(trials)  # built once: a finished run's tables are cached from now on
    out: dict[str, Any] = {"tables": [], "problems": [], "verdicts": None}
    if not records:
        out["problems"].append("no trial records yet")
        return out
    df = records_frame(records)
    metrics = {c.removeprefix("m.") for c in df.columns if c.startswith("m.")}
    for spec in table_specs(config):
        if spec.metric not in metrics:
            out["problems"].append(f"table {spec.name}: the records have no metric {spec.metric!r}")
            continue
        try:
            table = build_table(df, spec)
        except ValueError as exc:
            out["problems"].append(f"table {spec.name}: {exc}")
            continue
        table.overrides = overrides_caption(manifest)
        disp = table.display
        out["tables"].append({
            "name": spec.name, "title": table.title, "rows_label": disp.index.name,
            "columns": [str(c) for c in disp.columns],
            "rows": [(str(i), [str(v) for v in disp.loc[i].tolist()]) for i in disp.index],
            "footer": table.footer, "plot": json.dumps(_plot_data(table)),
            "main": spec.name == main_table(config), "kind": spec.kind,
            "row_is_mode": spec.rows == "mode",
        })
    try:
        block: VerdictBlock | None = verdict_block(records, config, frame=df)
    except ValueError as exc:
        out["problems"].append(f"verdicts: {exc}")
        block = None
    if block is not None:
        out["verdicts"] = {"heading": block.heading, "note": block.note,
                           "header": block.header(), "rows": block.display_rows(),
                           "words": list(block.verdicts)}
    return out


def _tables_job(index: ResultsIndex, run_id: str) -> tuple[tuple[Any, ...], Future[dict[str, Any]] | None]:
    """The cache key of run `run_id`'s tables as of now and, unless they are cached, the
    build of them (started here if none is running: one build per version of the run, which
    a page that polls while it runs waits for)."""
    key = ("run", run_id, index.trials(run_id).version)
    if key in index.cache:
        return key, None
    with index.jobs_lock:
        job = index.jobs.get(key)
        if job is None:
            job = index.jobs[key] = _POOL.submit(_build_tables, index, run_id)
    return key, job


def start_tables(index: ResultsIndex, run_id: str) -> None:
    """Start building run `run_id`'s tables in the background (a page asks for them later)."""
    try:
        _tables_job(index, run_id)
    except ViewError:
        pass  # the run went away: nothing to build


def _run_tables(index: ResultsIndex, run_id: str) -> dict[str, Any]:
    key, job = _tables_job(index, run_id)
    if job is None:
        return dict(index.cache[key])
    try:
        content = job.result(timeout=TABLES_WAIT_S)
    except FutureTimeout:
        return {"tables": [], "problems": [], "verdicts": None, "pending": True,
                "records": len(index.trials(run_id).rows)}
    except Exception as exc:  # noqa: BLE001 - shown on the page, never a blank 500
        content = {"tables": [], "problems": [f"cannot build the tables: {exc}"], "verdicts": None}
    index.cache[key] = content
    with index.jobs_lock:
        index.jobs.pop(key, None)
    return dict(content)


def run_page(request: Request, index: ResultsIndex) -> tuple[str, dict[str, Any]]:
    run_id = _run_id(request)
    from harness.view.data import summarize

    summary = summarize(run_id, index.run_dir(run_id), len(index.trials(run_id).rows))
    _, config = _config(index, run_id)
    content = _run_tables(index, run_id)
    return "run.html", {"run": summary, "config": config, "live": summary.status == "running",
                        "pending": False, **content}


# --------------------------------------------------------------------------- trials


def _cells_in_order(config: ExperimentConfig, rows: list[TrialRow]) -> list[str]:
    planned = [cell_id(config, c) for c in expand_cells(config)]
    present = {r.cell_id for r in rows}
    return [c for c in planned if c in present] + sorted(present - set(planned))


def trials_page(request: Request, index: ResultsIndex) -> tuple[str, dict[str, Any]]:
    run_id = _run_id(request)
    trials = index.trials(run_id)
    _, config = _config(index, run_id)
    filters = {name: _q(request, name) for name in ("mode", "cell", "outcome", "fault", "task")}
    if filters["outcome"] and filters["outcome"] not in OUTCOMES:
        raise ViewError(f"outcome {filters['outcome']!r}: allowed: {', '.join(OUTCOMES)}")
    if filters["fault"] and filters["fault"] not in FAULT_FILTERS:
        raise ViewError(f"fault {filters['fault']!r}: allowed: {', '.join(FAULT_FILTERS)}")
    rows = trials.rows
    matched = filter_rows(rows, **filters)
    try:
        page_no = max(1, int(_q(request, "page", "1")))
    except ValueError:
        page_no = 1
    pages = max(1, math.ceil(len(matched) / PAGE_SIZE))
    page_no = min(page_no, pages)
    shown = matched[(page_no - 1) * PAGE_SIZE: page_no * PAGE_SIZE]
    present_modes = list(dict.fromkeys(r.mode for r in rows))
    modes = [m for m in config.modes if m in present_modes] + sorted(set(present_modes) - set(config.modes))
    return "trials.html", {
        "run_id": run_id, "config": config, "rows": shown, "matched": len(matched),
        "total": len(rows), "filters": filters, "modes": modes,
        "cells": _cells_in_order(config, rows), "outcomes": OUTCOMES, "faults": FAULT_FILTERS,
        "page": page_no, "pages": pages, "damaged": trials.damaged,
        "live": read_manifest(index.run_dir(run_id)).get("status") == "running",
    }


# --------------------------------------------------------------------------- one trial


def _partners(rows: list[TrialRow], row: TrialRow) -> list[TrialRow]:
    return [r for r in rows if r.cell_id == row.cell_id and r.trial == row.trial and r.key != row.key]


def trial_page(request: Request, index: ResultsIndex) -> tuple[str, dict[str, Any]]:
    run_id = _run_id(request)
    key = _q(request, "key")
    trials = index.trials(run_id)
    record = trials.record(key)
    row = next(r for r in trials.rows if r.key == key)
    replay_llm = _q(request, "replay") == "1"
    view = index.cached(("trial", run_id, key, replay_llm),
                        lambda: trial_view(index.run_dir(run_id), record, replay_llm=replay_llm))
    return "trial.html", {"run_id": run_id, "row": row, "record": record, "view": view,
                          "partners": _partners(trials.rows, row),
                          "metrics": sorted((record.get("metrics") or {}).items())}


# --------------------------------------------------------------------------- side by side


def compare_page(request: Request, index: ResultsIndex) -> tuple[str, dict[str, Any]]:
    run_id = _run_id(request)
    trials = index.trials(run_id)
    cell, a, b = _q(request, "cell"), _q(request, "a"), _q(request, "b")
    try:
        trial = int(_q(request, "trial"))
    except ValueError:
        raise ViewError("trial: give the trial number (an integer)") from None
    same = [r for r in trials.rows if r.cell_id == cell and r.trial == trial]
    if not same:
        raise ViewError(f"no trial {trial} in cell {cell!r} of run {run_id}")
    modes = [r.mode for r in same]
    for name, mode in (("a", a), ("b", b)):
        if mode not in modes:
            raise ViewError(f"{name}: mode {mode!r} has no trial {trial} in cell {cell!r}; "
                            f"it has: {', '.join(modes)}")
    left_row = next(r for r in same if r.mode == a)
    right_row = next(r for r in same if r.mode == b)
    run_dir = index.run_dir(run_id)
    left = index.cached(("trial", run_id, left_row.key, False),
                        lambda: trial_view(run_dir, trials.record(left_row.key)))
    right = index.cached(("trial", run_id, right_row.key, False),
                         lambda: trial_view(run_dir, trials.record(right_row.key)))
    aligned = align(left.entries, right.entries)
    return "compare.html", {"run_id": run_id, "cell": cell, "trial": trial, "a": a, "b": b,
                            "modes": modes, "left": left, "right": right, "aligned": aligned,
                            "left_row": left_row, "right_row": right_row}
