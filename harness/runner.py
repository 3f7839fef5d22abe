"""Runs an experiment: every (cell, trial, mode) once, in worker processes, into a run
directory that can be resumed.

Layout: `<out>/<config-name>/<run-id>/{manifest.json, trials.jsonl, tables/, plots/}`.
A trial record is one JSON line written with a single write and flushed, so a record is
whole or absent; a torn final line (a crash mid-write) is cut off when the run resumes.
Resuming runs exactly the trials whose keys are missing, so nothing is duplicated or lost.
"""

from __future__ import annotations

import datetime as _dt
import json
import multiprocessing
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomix.adapters.oplog import truncate_torn_tail
from harness.config import (
    ExperimentConfig,
    cell_config,
    cell_id,
    cell_label,
    config_hash,
    expand_cells,
)
from harness.errors import RunError  # defined there (cheap to import); used here
from harness.trial import TrialSpec, run_trial

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


def plan(config: ExperimentConfig) -> list[TrialSpec]:
    """Every trial of the experiment, ordered cell, trial, mode (modes of one trial adjacent)."""
    name = config.name or "experiment"
    specs = []
    for cell in expand_cells(config):
        cfg = cell_config(config, cell)
        cid = cell_id(config, cell)
        shown = {cell_label(config, k): v for k, v in cell.items()}
        # A cell may ask for fewer trials than the config (paper Table 3 runs its F2/F4-only
        # cells at N=100 beside N=300), never more, so --trials still caps every cell.
        for trial in range(min(cfg.trials, config.trials)):
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
                        settings=cfg.settings.mode_settings(),
                        latency_ms=cfg.tool.latency_ms,
                        jitter_ms=cfg.tool.jitter_ms,
                        params=cfg.params,
                        agent=cfg.agent,
                    )
                )
    return specs


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
    base = (out or DEFAULT_RESULTS) / (config.name or "experiment")
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    candidate = base / stamp
    n = 1
    while candidate.exists():
        n += 1
        candidate = base / f"{stamp}-{n}"
    return candidate


def read_records(path: Path) -> list[dict[str, Any]]:
    """The whole records of a trials file (a torn final line is ignored)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in lines[:-1] if line.strip()]


def _write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    tmp = run_dir / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / "manifest.json")


def _worker(spec: TrialSpec) -> dict[str, Any]:
    return run_trial(spec)


def _ignore_sigint() -> None:
    # Ctrl-C reaches the whole process group: let the parent alone handle it (it marks the
    # run interrupted and terminates the pool), so workers do not print tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _results(specs: list[TrialSpec], jobs: int) -> Iterator[dict[str, Any]]:
    if jobs <= 1 or len(specs) <= 1:
        for spec in specs:
            yield run_trial(spec)
        return
    ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with ctx.Pool(jobs, initializer=_ignore_sigint) as pool:
        # Chunks keep a trial's modes together, so a worker reuses that trial's goal state.
        chunk = max(1, min(16, len(specs) // (jobs * 8) or 1))
        yield from pool.imap_unordered(_worker, specs, chunksize=chunk)


def run(
    config: ExperimentConfig,
    *,
    out: Path | None = None,
    jobs: int = 1,
    resume: Path | None = None,
    progress: Callable[[int, int, dict[str, Any] | None], None] | None = None,
    on_start: Callable[[Path], None] | None = None,
) -> RunResult:
    """Run (or resume) an experiment and return where its records are.

    `on_start(run_dir)` is called once the run directory exists, before any trial runs
    (so a caller can say where an interrupted run lives).
    """
    from atomix import __version__

    specs = plan(config)
    digest = config_hash(config)
    if resume is not None:
        run_dir = Path(resume)
        manifest_path = run_dir / "manifest.json"
        if not manifest_path.exists():
            raise RunError(f"{run_dir}: not a run directory (no manifest.json)")
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if manifest.get("config_hash") != digest:
            raise RunError(
                f"{run_dir}: was started with another config (hash {manifest.get('config_hash')}, "
                f"now {digest}); start a new run instead"
            )
    else:
        run_dir = new_run_dir(config, out)
        run_dir.mkdir(parents=True)
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
        _write_manifest(run_dir, manifest)
    records_path = run_dir / "trials.jsonl"
    if records_path.exists():
        truncate_torn_tail(records_path)
    done = {r["key"] for r in read_records(records_path)}
    todo = [s for s in specs if s.key not in done]
    manifest["status"] = "running"
    manifest.setdefault("resumed_at", [])
    if resume is not None:
        manifest["resumed_at"].append(_now())
    _write_manifest(run_dir, manifest)
    if on_start:
        on_start(run_dir)
    start = time.perf_counter()
    ran = 0
    if progress:
        progress(len(done), len(specs), None)
    try:
        with open(records_path, "a", encoding="utf-8") as fh:
            for record in _results(todo, jobs):
                fh.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
                fh.flush()
                ran += 1
                if progress:
                    progress(len(done) + ran, len(specs), record)
            os.fsync(fh.fileno())
    except BaseException:
        manifest["status"] = "interrupted"
        _write_manifest(run_dir, manifest)
        raise
    wall = time.perf_counter() - start
    manifest["status"] = "complete"
    manifest["finished_at"] = _now()
    manifest["wall_s_last_session"] = round(wall, 3)
    _write_manifest(run_dir, manifest)
    return RunResult(run_dir, len(specs), ran, len(done), wall)
