"""Runs an experiment: every (cell, trial, mode) once, in worker processes, into a run
directory that can be resumed.

Layout: `<out>/<config-name>/<run-id>/{manifest.json, trials.jsonl, tables/, plots/}`.
A trial record is one JSON line written with a single write, so a record is whole or
absent; a torn final line (a crash mid-write) is cut off when the run resumes, and a write
the disk refuses part-way is cut back at once. Resuming runs exactly the trials whose keys
are missing, so nothing is duplicated or lost.

One process owns a run directory at a time (`harness.experiment.rundir.RunLock`); SIGINT/SIGTERM
become `harness.experiment.interrupts.Interrupted` and leave the run `interrupted` and resumable.
Where the trials run (this machine, a dask cluster) is the executor's business
(`harness.experiment.executors`): it yields records, this module alone writes them.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomix.adapters.oplog import truncate_torn_tail
from harness.errors import RunError  # defined there (cheap to import); used here
from harness.experiment.cells import cell_id, cell_label, expand_cells
from harness.experiment.config import ExperimentConfig, cell_config, config_difference, config_hash
from harness.experiment.executors import DEFAULT_EXECUTOR, Executor, ExecutorOptions, open_executor
from harness.experiment.interrupts import SignalGuard
from harness.experiment.record import TrialRecord
from harness.experiment.rundir import (
    MANIFEST,
    TRIALS,
    RunIOError,
    RunLock,
    damaged_summary,
    foreign_message,
    io_error,
    quarantine,
    read_manifest,
    scan_records,
    write_manifest,
)
from harness.experiment.task_select import check_task_ids, trials_for_tasks, workload_task_ids
from harness.experiment.trial import TrialSpec, run_trial

DEFAULT_RESULTS = Path("results")


@dataclass
class RunResult:
    """What a run did: where it wrote, how many trials, how fast."""

    run_dir: Path
    total: int
    ran: int
    skipped: int
    wall_s: float
    records_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.records_path = self.run_dir / "trials.jsonl"

    @property
    def trials_per_s(self) -> float:
        return self.ran / self.wall_s if self.wall_s > 0 else 0.0


def plan(
    config: ExperimentConfig, limit: int | None = None, tasks: Sequence[str] | None = None
) -> list[TrialSpec]:
    """Every trial of the experiment, ordered cell, trial, mode (modes of one trial adjacent).

    `limit`: only trials 0..limit-1 of each cell (and every mode); `tasks`: only the trials
    that perform these task ids (`harness.experiment.task_select`; with `limit` too, the
    first `limit` of those). The rest of the plan is unchanged, so a later run without them
    completes the same run. ConfigError (path `--tasks`) for task ids the config lacks."""
    name = config.name or "experiment"
    cells = [(cell, cell_config(config, cell)) for cell in expand_cells(config)]
    task_ids: list[list[str] | None] = []
    if tasks is not None:
        task_ids = [workload_task_ids(cfg.workload, cfg.params) for _, cfg in cells]
        check_task_ids(config.workload, task_ids, tasks)
    specs = []
    for index, (cell, cfg) in enumerate(cells):
        cid = cell_id(config, cell)
        shown = {cell_label(config, k): v for k, v in cell.items()}
        # A cell may ask for fewer trials than the config (paper Table 3 runs its F2/F4-only
        # cells at N=100 beside N=300), never more, so --trials still caps every cell.
        count = min(cfg.trials, config.trials)
        chosen = list(range(count))
        if tasks is not None:
            chosen = trials_for_tasks(tasks, task_ids[index] or [], count)
        for trial in chosen if limit is None else chosen[:limit]:
            for mode in config.modes:
                specs.append(
                    TrialSpec(
                        config=name,
                        workload=cfg.workload,
                        mode=mode,
                        cell_id=cid,
                        cell=shown,
                        trial=trial,
                        seed=cfg.seed,
                        faults=cfg.faults,
                        settings=cfg.settings.mode_settings(cfg.retries),
                        latency_ms=cfg.tool.latency_ms,
                        jitter_ms=cfg.tool.jitter_ms,
                        params=cfg.params,
                        agent=cfg.agent,
                        durable=cfg.durable,
                    )
                )
    return specs


def _ordered_like(mapping: dict[str, Any], like: Any) -> dict[str, Any]:
    """`mapping` with the keys `like` has first, in `like`'s order, then the rest."""
    first = [k for k in like if k in mapping] if isinstance(like, dict) else []
    return {k: mapping[k] for k in [*first, *(k for k in mapping if k not in first)]}


def in_run_order(config: ExperimentConfig, run_dir: Path) -> ExperimentConfig:
    """`config` with its grid keys and each cell's keys in the order of the run it resumes.

    A cell id names its keys in the order the config gave them, and the config hash does
    not see that order, so a resume whose overrides name the keys in another order (two
    `--set`s swapped) is the same config but would plan other ids; the run's own order
    keeps every recorded trial in the plan. A run that cannot be read is left to
    `_open_run` to report."""
    try:
        stored = read_manifest(run_dir)["config"]
    except RunError:
        return config
    grid = _ordered_like(config.grid, stored.get("grid"))
    cells = config.cells
    stored_cells = stored.get("cells")
    if isinstance(stored_cells, list) and len(stored_cells) == len(cells):
        cells = [_ordered_like(c, s) for c, s in zip(cells, stored_cells, strict=True)]
    return config.model_copy(update={"grid": grid, "cells": cells})


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def new_run_dir(config: ExperimentConfig, out: Path | None = None) -> Path:
    root = (out or DEFAULT_RESULTS).resolve()
    base = (root / (config.name or "experiment")).resolve()
    # Validation keeps names to plain identifiers; this is the belt to those braces (a name
    # that resolved through a symlink or '..' must never write outside --out).
    if base.parent != root:
        raise RunError(f"run name {config.name!r} would write outside {root}")
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    candidate = base / stamp
    n = 1
    while candidate.exists():
        n += 1
        candidate = base / f"{stamp}-{n}"
    return candidate


def _make_run_dir(config: ExperimentConfig, out: Path | None) -> Path:
    """Create a fresh run directory; two runs started in the same second get -2, -3, ..."""
    for _ in range(100):
        candidate = new_run_dir(config, out)
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            continue  # another run took that name between the check and the mkdir
        except OSError as exc:
            raise io_error(candidate, exc, "cannot create") from None
    raise RunError(f"{candidate}: cannot find a free run directory name")


def read_records(path: Path) -> list[TrialRecord]:
    """The whole trial records of a trials file: a torn final line, damaged lines and repeated
    keys are left out (`harness.experiment.rundir.scan_records` says which and why)."""
    return scan_records(path).records


#: os.write, through a name tests can replace to inject ENOSPC.
_write = os.write


class _RecordsFile:
    """Appends whole records to trials.jsonl: one write per record; a write the disk refuses
    part-way is cut back off, so the file never holds half a record followed by more."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self.size = os.fstat(self.fd).st_size
        except OSError as exc:
            raise io_error(path, exc) from None

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        try:
            while view:
                n = _write(self.fd, view)
                view = view[n:]
        except OSError as exc:
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                pass  # the torn tail is cut off when the run resumes
            raise io_error(self.path, exc) from None
        self.size += len(data)

    def close(self, sync: bool = True) -> None:
        try:
            if sync:
                os.fsync(self.fd)
        except OSError as exc:
            raise io_error(self.path, exc) from None
        finally:
            os.close(self.fd)


DAMAGED_CHOICES = ("rerun", "skip")


def _open_run(
    config: ExperimentConfig,
    specs: list[TrialSpec],
    digest: str,
    out: Path | None,
    resume: Path | None,
) -> tuple[Path, RunLock, dict[str, Any]]:
    """Create (or take over) the run directory: its lock and manifest."""
    from atomix import __version__

    if resume is not None:
        run_dir = Path(resume)
        if not (run_dir / MANIFEST).is_file():
            raise RunError(f"{run_dir}: not a run directory (no {MANIFEST})")
        lock = RunLock(run_dir).acquire()
        try:
            manifest = read_manifest(run_dir)
            if manifest.get("config_hash") != digest:
                what = config_difference(manifest.get("config"), config.model_dump(mode="json"))
                what = what or f"hash {manifest.get('config_hash')} in the run, {digest} now"
                raise RunError(
                    f"{run_dir}: was started with another config ({what}); resume it "
                    f"without a config or overrides (atomix run --resume {run_dir}), or "
                    "start a new run"
                )
        except BaseException:
            lock.release()
            raise
        return run_dir, lock, manifest
    run_dir = _make_run_dir(config, out)
    lock = RunLock(run_dir).acquire()
    manifest = {
        "config": config.model_dump(mode="json"),
        "config_hash": digest,
        "config_name": config.name,
        "package_version": __version__,
        "git_revision": git_revision(),
        "seed": config.seed,
        "trials_planned": len(specs),
        "started_at": _now(),
        "finished_at": None,
        "status": "running",
    }
    try:
        write_manifest(run_dir, manifest)
    except BaseException:
        lock.release()
        raise
    return run_dir, lock, manifest


def run(
    config: ExperimentConfig,
    *,
    out: Path | None = None,
    jobs: int = 1,
    resume: Path | None = None,
    progress: Callable[[int, int, dict[str, Any] | None], None] | None = None,
    on_start: Callable[[Path], None] | None = None,
    damaged: str = "rerun",
    notice: Callable[[str], None] | None = None,
    limit: int | None = None,
    executor: str = DEFAULT_EXECUTOR,
    scheduler: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    tasks: Sequence[str] | None = None,
) -> RunResult:
    """Run (or resume) an experiment and return where its records are.

    Guarantees: the run directory is owned by this process for the whole call (RunLocked if
    another live process owns it); every planned trial ends with exactly one whole record,
    except trials a damaged line held when `damaged="skip"`; on SIGINT/SIGTERM
    (`Interrupted`), a disk error (`RunIOError`) or any other exception the manifest says
    `interrupted` and the run can be resumed.

    `on_start(run_dir)` is called once the run directory exists, before any trial runs (so
    a caller can say where an interrupted run lives). On resume, damaged lines of
    trials.jsonl are moved to trials.damaged.jsonl and their trials run again
    (`damaged="rerun"`), or left where they are with the trials they name not run again
    (`damaged="skip"`); `notice` receives one line saying which.

    `limit` runs only trials 0..limit-1 of every cell and mode (see `plan`); the manifest
    records it (`limit`) and plans only those trials. Resuming without it plans, and runs,
    the rest. `tasks` (task ids, see `harness.experiment.task_select`) works the same way
    (manifest key `tasks`). The manifest's `trials_total` is the whole plan's size, so a
    listing can say "3 of 72".

    `executor` names where trials run (`harness.experiment.executors.EXECUTORS`: "local", "dask"),
    `scheduler` the dask scheduler address (None: a LocalCluster of `jobs` workers). The
    executor is opened before the run directory, so an unknown name, a scheduler that
    cannot be reached or a missing dask install (RunError) leaves nothing behind. Records
    are the same whichever executor ran them, apart from `timings`; with more than one
    worker they are written in the order they finish.

    `overrides` (dotted config key -> value, as the command line changed the config file) are
    kept in the manifest (`overrides`) of a new run, so that its tables can say what it was
    run with; a resume keeps the ones its run started with.
    """
    if damaged not in DAMAGED_CHOICES:
        raise ValueError(f"damaged must be one of {DAMAGED_CHOICES}, got {damaged!r}")
    if resume is not None:
        config = in_run_order(config, Path(resume))
    specs = plan(config, limit, tasks)
    subset = limit is not None or tasks is not None
    whole = plan(config) if subset else specs
    digest = config_hash(config)
    name = config.name or "experiment"
    opened: tuple[Path, RunLock, dict[str, Any]] | None = None
    engine: Executor | None = None
    with SignalGuard() as guard:
        try:
            options = ExecutorOptions(jobs=jobs, scheduler=scheduler, trial=run_trial)
            engine = open_executor(executor, options)
            # A signal is held until the directory has its lock and manifest and the caller
            # knows where it is: in between it would leave a directory nobody can resume.
            with guard.critical():
                opened = _open_run(config, specs, digest, out, resume)
                if on_start:
                    on_start(opened[0])
            run_dir, _, manifest = opened
            if overrides and "overrides" not in manifest:
                manifest["overrides"] = dict(overrides)  # written with the status below
            return _run_locked(
                specs, digest, name, run_dir, manifest, engine, resume, progress, damaged,
                notice, limit, {s.key for s in whole} if subset else None,
                list(tasks) if tasks is not None else None, len(whole),
            )
        except BaseException:
            if opened is not None and opened[2].get("status") == "running":
                opened[2]["status"] = "interrupted"
                try:
                    write_manifest(opened[0], opened[2])
                except RunIOError:
                    pass  # the free lock tells the next reader it was interrupted
            raise
        finally:
            if engine is not None:
                engine.close()
            if opened is not None:
                opened[1].release()


def _run_locked(
    specs: list[TrialSpec],
    digest: str,
    name: str,
    run_dir: Path,
    manifest: dict[str, Any],
    engine: Executor,
    resume: Path | None,
    progress: Callable[[int, int, dict[str, Any] | None], None] | None,
    damaged: str,
    notice: Callable[[str], None] | None,
    limit: int | None = None,
    known: set[str] | None = None,
    tasks: list[str] | None = None,
    total: int | None = None,
) -> RunResult:
    records_path = run_dir / TRIALS
    planned = {s.key for s in specs}
    # Records past a --limit are this run's own, not another config's.
    scan = scan_records(records_path, name, digest, known or planned)
    if scan.foreign:
        raise RunError(foreign_message(records_path, scan.foreign, name, digest))
    if scan.torn_tail:
        try:
            truncate_torn_tail(records_path)
        except OSError as exc:
            raise io_error(records_path, exc) from None
    done = scan.keys() & planned
    skip: set[str] = set()
    if scan.damaged:
        what = f"{records_path}: {damaged_summary(scan.damaged)}"
        if damaged == "rerun":
            aside = quarantine(run_dir, scan.damaged)
            say = f"{what}; moved to {aside.name}, their trials run again (--damaged skip to leave them out)"
        else:
            skip = {d.key for d in scan.damaged if d.key in planned and d.key not in done}
            unknown = sum(1 for d in scan.damaged if d.key is None)
            say = (
                f"{what}; skipped: {len(skip)} trial(s) they name are not run again"
                + (f", {unknown} line(s) name no trial (any trial missing is run)" if unknown else "")
            )
        if notice:
            notice(say)
    todo = [s for s in specs if s.key not in done and s.key not in skip]
    manifest["status"] = "running"
    manifest["trials_planned"] = len(specs)  # a resume may lift (or set) a --limit
    if limit is None:
        manifest.pop("limit", None)
    else:
        manifest["limit"] = limit
    if tasks is None:
        manifest.pop("tasks", None)
    else:
        manifest["tasks"] = tasks
    manifest["trials_total"] = total if total is not None else len(specs)
    manifest.pop("interrupted_detected_at", None)
    manifest.setdefault("resumed_at", [])
    if resume is not None:
        manifest["resumed_at"].append(_now())
    write_manifest(run_dir, manifest)
    start = time.perf_counter()
    ran = 0
    if progress:
        progress(len(done), len(specs), None)
    fh = _RecordsFile(records_path)
    try:
        with closing(engine.results(todo)) as results:
            for record in results:
                record["config_hash"] = digest
                fh.append(record)
                ran += 1
                if progress:
                    progress(len(done) + ran, len(specs), record)
    except BaseException:
        fh.close(sync=False)
        raise
    fh.close()
    wall = time.perf_counter() - start
    manifest["status"] = "complete"
    manifest["finished_at"] = _now()
    manifest["wall_s_last_session"] = round(wall, 3)
    if skip:
        manifest["trials_skipped"] = sorted(skip)
    else:
        manifest.pop("trials_skipped", None)
    write_manifest(run_dir, manifest)
    return RunResult(run_dir, len(specs), ran, len(done), wall)
