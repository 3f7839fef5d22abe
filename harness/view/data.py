"""What `atomix view` reads: the runs under a results directory and each run's trials.

Everything is read from disk on request, so a run that is still writing shows its new trials
on the next request: a run's trial index is kept per run and brought up to date by reading
only the lines appended to trials.jsonl since the last request (the file is append-only; a
file that shrank or was replaced is read again from the start). A line not yet ended by a
newline (a write in progress) is left for the next request.

Each line is parsed once: what is appended is read in one go and every line parsed as it
comes, the trials page's summary row made from it, and the parsed records kept for the
run's tables (for the few runs looked at last: see `ResultsIndex.KEEP_RECORDS`; a run whose
records were let go parses its file again when its tables are next built).

Run ids in URLs are paths relative to the root the view was started on, checked to stay
inside it.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.collector import collector_paused
from harness.errors import RunError
from harness.experiment.rundir import MANIFEST, TRIALS, count_lines, read_manifest, settle_status

__all__ = [
    "OUTCOMES",
    "ResultsIndex",
    "RunSummary",
    "TrialIndex",
    "TrialRow",
    "ViewError",
    "outcomes_of",
]

#: The outcome filters of the trials page, in the order they are offered.
OUTCOMES: tuple[str, ...] = (
    "clean",
    "not clean",
    "goal missed",
    "leaked",
    "duplicated",
    "residue",
    "budget exhausted",
    "error",
)


class ViewError(Exception):
    """A page cannot be shown (unknown run or trial); the message says which and why."""


def outcomes_of(record: dict[str, Any]) -> list[str]:
    """The outcome tags of one trial record (see OUTCOMES): `clean` or `not clean`, then
    each way it went wrong that the oracle counted. `error`: the record says the trial
    failed to run (an `error` field) or an agent never finished (`stuck`)."""
    m = record.get("metrics") or {}
    tags = ["clean" if m.get("clean") else "not clean"]
    if m.get("goal") is False:
        tags.append("goal missed")
    if (m.get("leaks") or 0) > 0:
        tags.append("leaked")
    if (m.get("duplicates") or 0) > 0:
        tags.append("duplicated")
    if (m.get("residue") or 0) > 0:
        tags.append("residue")
    if (m.get("budget_exhausted") or 0) > 0:
        tags.append("budget exhausted")
    if record.get("error") or (m.get("stuck") or 0) > 0:
        tags.append("error")
    return tags


@dataclass(frozen=True, slots=True)
class TrialRow:
    """One trial as the trials page lists it (a summary of its record, not the record)."""

    line: int  # its position among the run's records, 1-based (as `atomix show RUN N`)
    key: str
    mode: str
    cell_id: str
    trial: int
    task: str
    outcomes: tuple[str, ...]
    fault_classes: tuple[str, ...]
    faults: int
    committed: int
    agents: int
    steps: int
    makespan_ms: float

    @property
    def clean(self) -> bool:
        return "clean" in self.outcomes


def _row(line: int, rec: dict[str, Any]) -> TrialRow:
    m = rec.get("metrics") or {}
    faults = rec.get("faults") or []
    tasks = [str(a.get("task")) for a in rec.get("agents") or [] if a.get("task") is not None]
    return TrialRow(
        line=line,
        key=str(rec.get("key")),
        mode=str(rec.get("mode")),
        cell_id=str(rec.get("cell_id")),
        trial=int(rec.get("trial") or 0),
        task=",".join(dict.fromkeys(tasks)),
        outcomes=tuple(outcomes_of(rec)),
        fault_classes=tuple(sorted({str(f.get("fault")) for f in faults})),
        faults=len(faults),
        committed=int(m.get("committed") or 0),
        agents=int(m.get("agents") or 0),
        steps=int(m.get("steps") or 0),
        makespan_ms=float(m.get("makespan_ms") or 0.0),
    )


#: A read that parses at least this many records moves them out of the cyclic garbage
#: collector's reach (see `_parsing`).
FREEZE_AFTER = 2000


@contextmanager
def _parsing(records: list[Any]) -> Iterator[None]:
    """The cyclic garbage collector off while records are parsed into `records`; if many
    were, everything alive is then frozen (`gc.freeze`), as the workloads do with their
    shared data (`harness.workloads.tau2_data.freeze_long_lived`).

    Parsing a run's records allocates hundreds of thousands of containers that stay alive
    as long as the view serves the run; every full collection after would walk all of them
    again (a replay's own collections, a table's build), at more cost than the parsing.
    Parsed JSON holds no cycles, so there is nothing in them for the collector to find, and
    a record let go is still freed (by its reference count)."""
    before = len(records)
    try:
        with collector_paused():
            yield
    finally:
        if len(records) - before >= FREEZE_AFTER:
            gc.freeze()


@dataclass(eq=False)  # one per run, told apart by identity
class TrialIndex:
    """A run's trials, read incrementally: `rows` in file order (first record of each key),
    for each key the byte offset and length of its line (a trial's page reads its line
    alone), and, unless let go (`drop_records`), the parsed record of every row, in the
    same order, for the run's tables. Every line is parsed once while kept."""

    path: Path
    rows: list[TrialRow] = field(default_factory=list)
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)
    read_to: int = 0
    inode: int | None = None
    damaged: int = 0
    version: int = 0  # bumped whenever rows change (caches of derived pages key on it)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The parsed record of each row (None: let go; `records()` parses the file again).
    kept: list[dict[str, Any]] | None = field(default_factory=list)

    def refresh(self) -> TrialIndex:
        """Read what was appended since the last call (or everything, if the file shrank or
        was replaced)."""
        with self.lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                return self
            if self.inode != st.st_ino or st.st_size < self.read_to:
                self.rows, self.offsets, self.read_to, self.damaged = [], {}, 0, 0
                self.kept = []
                self.inode = st.st_ino
                self.version += 1
            if st.st_size == self.read_to:
                return self
            with self.path.open("rb") as fh:
                fh.seek(self.read_to)
                chunk = fh.read(st.st_size - self.read_to)
            end = chunk.rfind(b"\n")
            if end < 0:
                return self  # one line, still being written
            pos = self.read_to
            rows, offsets, kept = self.rows, self.offsets, self.kept
            loads = json.loads
            with _parsing(rows):
                for raw in chunk[: end + 1].split(b"\n")[:-1]:
                    start, pos = pos, pos + len(raw) + 1
                    if not raw.strip():
                        continue
                    try:
                        rec = loads(raw)
                        key = str(rec["key"])
                        rec["metrics"]  # noqa: B018 - a record without metrics is damaged
                    except (ValueError, KeyError, TypeError):
                        self.damaged += 1
                        continue
                    if key in offsets:
                        continue  # a repeated key: the first record counts (as every reader)
                    offsets[key] = (start, len(raw))
                    rows.append(_row(len(rows) + 1, rec))
                    if kept is not None:
                        kept.append(rec)
            self.read_to += end + 1
            self.version += 1
            return self

    def record(self, key: str) -> dict[str, Any]:
        """The whole stored record of trial `key` (its line alone, read again: a page may
        change what it is given)."""
        if key not in self.offsets:
            raise ViewError(f"no trial {key!r} in {self.path}")
        start, length = self.offsets[key]
        with self.path.open("rb") as fh:
            fh.seek(start)
            data: dict[str, Any] = json.loads(fh.read(length))
        return data

    def records(self) -> list[dict[str, Any]]:
        """Every record of `rows`, in file order, as of now (a new list: the records are
        shared with the index, and are not to be changed)."""
        return self.snapshot()[1]

    def snapshot(self) -> tuple[int, list[dict[str, Any]]]:
        """`version` and the records of that version, taken together (a refresh between
        the two could otherwise pair a version with the records of the next)."""
        with self.lock:
            if self.kept is None:
                self.kept = self._parse_rows()
            return self.version, list(self.kept)

    def drop_records(self) -> None:
        """Let the parsed records go (the rows stay); `records()` parses them again."""
        with self.lock:
            self.kept = None

    @property
    def holds_records(self) -> bool:
        return self.kept is not None

    def _parse_rows(self) -> list[dict[str, Any]]:
        # The file read once, up to what the rows cover, and each row's line parsed from it.
        with self.path.open("rb") as fh:
            data = fh.read(self.read_to)
        out: list[dict[str, Any]] = []
        with _parsing(out):
            for row in self.rows:
                start, length = self.offsets[row.key]
                out.append(json.loads(data[start: start + length]))
        return out


@dataclass(frozen=True)
class RunSummary:
    """One run as the runs page lists it, from its manifest and a count of its lines."""

    run_id: str
    config: str
    workload: str
    agent: str
    started_at: str
    finished_at: str
    revision: str
    overrides: str
    sweep: str
    modes: tuple[str, ...]
    planned: int
    total: int
    done: int
    status: str
    wall_s: float | None
    limit: int | None

    @property
    def progress(self) -> float:
        return self.done / self.planned if self.planned else 0.0


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)



def summarize(run_id: str, run_dir: Path, done: int | None = None) -> RunSummary:
    """A run's row on the runs page (RunError for a damaged manifest)."""
    manifest = read_manifest(run_dir)
    status = settle_status(run_dir, manifest)
    config = manifest.get("config") or {}
    labels = config.get("labels") or {}
    grid = config.get("grid") or {}
    sweep = ", ".join(f"{labels.get(k, k)}={_text(v)}" for k, v in grid.items())
    if config.get("cells"):
        sweep = (sweep + "; " if sweep else "") + f"{len(config['cells'])} listed cells"
    overrides = manifest.get("overrides") or {}
    planned = int(manifest.get("trials_planned") or 0)
    wall = manifest.get("wall_s_last_session")
    return RunSummary(
        run_id=run_id,
        config=str(manifest.get("config_name") or config.get("name") or run_dir.parent.name),
        workload=str(config.get("workload") or "?"),
        agent=str((config.get("agent") or {}).get("kind") or "?"),
        started_at=str(manifest.get("started_at") or "?"),
        finished_at=str(manifest.get("finished_at") or ""),
        revision=str(manifest.get("git_revision") or "")[:10],
        overrides=", ".join(f"{k}={_text(v)}" for k, v in overrides.items()),
        sweep=sweep,
        modes=tuple(str(m) for m in config.get("modes") or ()),
        planned=planned,
        total=int(manifest.get("trials_total") or planned),
        done=count_lines(run_dir / TRIALS) if done is None else done,
        status=status,
        wall_s=float(wall) if isinstance(wall, int | float) else None,
        limit=manifest.get("limit") if isinstance(manifest.get("limit"), int) else None,
    )


class ResultsIndex:
    """The runs under `root`: a results directory (`root/<config>/<run-id>/`), one config's
    directory, or a single run directory. Guarantees: `run_dir` only ever returns a run
    directory inside `root`; trial indexes are shared between requests and brought up to
    date on each."""

    #: How many runs keep their parsed records (those used last): records take far more
    #: memory than the trials page's rows (the server's resident size after `python -m
    #: harness.bench.view` shows how much). A run that is still writing keeps them for its next
    #: tables (built again as it grows); a finished run lets them go once its tables are
    #: built (see `harness.view.pages`).
    KEEP_RECORDS = 2

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ViewError(f"{root}: no such directory (give a results directory or a run)")
        self._indexes: dict[Path, TrialIndex] = {}
        self._lock = threading.Lock()
        self._holding: list[TrialIndex] = []  # indexes that keep records, last used last
        self.cache: dict[tuple[Any, ...], Any] = {}  # derived pages, keyed with a version
        # Derived pages being built in the background, by the key they will be cached under.
        self.jobs: dict[tuple[Any, ...], Future[Any]] = {}
        self.jobs_lock = threading.Lock()

    def prefetch(self, then: Callable[[str], Any] | None = None) -> threading.Thread:
        """Read every run's trials in a background thread, newest run first, so the first
        trials page a reader opens is served from memory; `then(run_id)` is called once the
        newest run is read (to build its tables before anyone asks). Only the newest run
        keeps its parsed records."""

        def work() -> None:
            dirs = sorted(self.run_dirs(), key=lambda d: d.stat().st_mtime, reverse=True)
            for i, run_dir in enumerate(dirs):
                try:
                    if i == 0:
                        run_id = self.run_id(run_dir)
                        self.trials(run_id)
                        if then is not None:
                            then(run_id)
                        continue
                    index = self._index(run_dir)
                    with self._lock:
                        if index not in self._holding:
                            index.drop_records()  # rows only: its records are parsed on use
                    index.refresh()
                except (ViewError, OSError):
                    continue

        thread = threading.Thread(target=work, name="atomix-view-prefetch", daemon=True)
        thread.start()
        return thread

    def run_dirs(self) -> list[Path]:
        if (self.root / MANIFEST).is_file():
            return [self.root]
        found = [p.parent for p in self.root.glob(f"*/{MANIFEST}")]
        found += [p.parent for p in self.root.glob(f"*/*/{MANIFEST}")]
        return sorted(set(found))

    def run_id(self, run_dir: Path) -> str:
        rel = run_dir.relative_to(self.root).as_posix()
        return rel if rel != "." else "."

    def run_dir(self, run_id: str) -> Path:
        path = (self.root / run_id).resolve()
        if not path.is_relative_to(self.root) or not (path / MANIFEST).is_file():
            raise ViewError(f"no run {run_id!r} under {self.root}")
        return path

    def runs(self) -> tuple[list[RunSummary], list[str]]:
        """Every run (newest first) and a line per run directory that could not be read."""
        rows, problems = [], []
        for run_dir in self.run_dirs():
            try:
                index = self._indexes.get(run_dir)
                # A run being read (by the prefetch) is not waited for: its lines are counted.
                fresh = index is not None and not index.lock.locked()
                done = len(index.refresh().rows) if fresh and index is not None else None
                rows.append(summarize(self.run_id(run_dir), run_dir, done))
            except RunError as exc:
                problems.append(str(exc))
        rows.sort(key=lambda r: (r.started_at, r.run_id), reverse=True)
        return rows, problems

    def _index(self, run_dir: Path) -> TrialIndex:
        with self._lock:
            index = self._indexes.get(run_dir)
            if index is None:
                index = self._indexes[run_dir] = TrialIndex(run_dir / TRIALS)
            return index

    def trials(self, run_id: str) -> TrialIndex:
        """Run `run_id`'s trial index, brought up to date."""
        index = self._index(self.run_dir(run_id)).refresh()
        if index.holds_records:
            self.used(index)
        return index

    def snapshot(self, run_id: str) -> tuple[TrialIndex, int, list[dict[str, Any]]]:
        """Run `run_id`'s trial index, brought up to date, with a version and its records
        (parsed again if they were let go; kept from now on, as the run's were used last)."""
        index = self.trials(run_id)
        version, records = index.snapshot()
        self.used(index)
        return index, version, records

    def used(self, index: TrialIndex) -> None:
        """Mark `index`'s records as used now; the records of runs used longest ago beyond
        `KEEP_RECORDS` are let go."""
        with self._lock:
            if index in self._holding:
                self._holding.remove(index)
            self._holding.append(index)
            while len(self._holding) > self.KEEP_RECORDS:
                self._holding.pop(0).drop_records()

    def let_go(self, index: TrialIndex) -> None:
        """Let `index`'s records go now (a finished run whose tables are built has no more
        use for them)."""
        with self._lock:
            if index in self._holding:
                self._holding.remove(index)
            index.drop_records()

    def cached(self, key: tuple[Any, ...], make: Any) -> Any:
        """`make()` once per `key` (a key names the version of what it was made from)."""
        if key not in self.cache:
            if len(self.cache) > 256:
                self.cache.clear()
            self.cache[key] = make()
        return self.cache[key]


def filter_rows(
    rows: Iterable[TrialRow],
    *,
    mode: str = "",
    cell: str = "",
    outcome: str = "",
    fault: str = "",
    task: str = "",
) -> list[TrialRow]:
    """The rows that match every filter given ("" matches anything). `fault` is a class
    (F1..F5), "any" (at least one fault injected) or "none"; `task` matches a part of the
    task id."""
    out = []
    for r in rows:
        if mode and r.mode != mode:
            continue
        if cell and r.cell_id != cell:
            continue
        if outcome and outcome not in r.outcomes:
            continue
        if fault == "any" and not r.faults:
            continue
        if fault == "none" and r.faults:
            continue
        if fault and fault not in ("any", "none") and fault not in r.fault_classes:
            continue
        if task and task not in r.task:
            continue
        out.append(r)
    return out
