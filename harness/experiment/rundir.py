"""Run directories on disk: who owns one (the lock), its manifest, its status, and reading its
trial records without crashing on damaged lines.

Standard library only: `atomix runs` lists runs through this module, and the command line
must start fast.

Lock design: `run.lock` in the run directory, held with `fcntl.flock(LOCK_EX)` by the one
process that runs or resumes the run. The kernel drops a flock when its holder dies (even by
SIGKILL), so a lock left by a killed process is simply free for the next owner to take. The
file also says who holds it (pid, host, start time, the pid's kernel start tick) so that a
refused second process can name the holder; it is emptied, never unlinked, on release (an
unlinked lock file lets two processes each lock a different inode).
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.errors import RunError
from harness.experiment.record import TrialRecord

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no locking, as before
    fcntl = None  # type: ignore[assignment]

MANIFEST = "manifest.json"
TRIALS = "trials.jsonl"
LOCK = "run.lock"
DAMAGED = "trials.damaged.jsonl"

#: A trial record must have these fields with these types; anything else is a damaged line.
RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "key": str,
    "mode": str,
    "cell_id": str,
    "trial": int,
    "metrics": dict,
}


class RunLocked(RunError):
    """The run directory is owned by another live process (exit 2)."""

    def __init__(self, run_dir: Path, holder: Holder | None) -> None:
        self.holder = holder
        who = holder.describe() if holder else "another process (it has not said who yet)"
        super().__init__(
            f"{run_dir}: in use by {who}; wait for it to finish or stop it, then resume"
        )


class RunIOError(RunError):
    """The disk refused a read or write (full, read-only, no permission): exit 1; the run
    directory is left consistent and can be resumed once the disk is usable."""


def io_error(path: Path | str, exc: OSError, what: str = "cannot write") -> RunIOError:
    """A one-line RunIOError for an OSError: what failed, on which file, and the errno name."""
    name = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc)
    where = exc.filename or path
    return RunIOError(f"{what} {where}: {reason}{f' ({name})' if name else ''}")


# --------------------------------------------------------------------------- the lock


def _proc_start(pid: int) -> int | None:
    """The kernel's start tick of a process (Linux), to tell a pid from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a run's lock."""

    pid: int
    host: str
    started_at: str
    proc_start: int | None = None

    @classmethod
    def me(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname(), _now(), _proc_start(os.getpid()))

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            data = json.loads(text)
            return cls(
                int(data["pid"]),
                str(data["host"]),
                str(data["started_at"]),
                data.get("proc_start"),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def dumps(self) -> str:
        return json.dumps(
            {
                "pid": self.pid,
                "host": self.host,
                "started_at": self.started_at,
                "proc_start": self.proc_start,
            }
        )

    def alive(self) -> bool | None:
        """Is the process still running? None when it ran on another host (cannot tell)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by someone else
        if self.proc_start is not None:
            now = _proc_start(self.pid)
            if now is not None and now != self.proc_start:
                return False  # the pid was reused by another process
        return True

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} (since {self.started_at})"


#: File descriptors of the locks this process holds; a forked worker closes its copies so
#: that a worker outliving a killed parent cannot keep the run locked.
_HELD_FDS: set[int] = set()


def close_inherited_locks() -> None:
    """In a forked child: drop the inherited lock descriptors (the parent keeps its own)."""
    for fd in list(_HELD_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_FDS.clear()


def _read_holder(fd: int) -> Holder | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", "replace")
    except OSError:
        return None
    return Holder.parse(text) if text.strip() else None


class RunLock:
    """Exclusive ownership of one run directory by one process (see the module docstring).

    `acquire()` either returns with the lock held and this process named in `run.lock`, or
    raises RunLocked (a live process holds it) or RunIOError (the lock file cannot be
    written). `previous` is the holder a stale lock named, if any (a killed process).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self.fd: int | None = None
        self.previous: Holder | None = None

    def acquire(self, wait_s: float = 0.5) -> RunLock:
        if fcntl is None:  # pragma: no cover
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise io_error(self.path, exc, "cannot lock") from None
        # A short wait: `runs`/`report` take a shared lock for an instant to settle a status,
        # and a new owner writes its name just after taking the lock.
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise RunLocked(self.run_dir, holder) from None
                time.sleep(0.02)
            except OSError as exc:
                os.close(fd)
                raise io_error(self.path, exc, "cannot lock") from None
        self.previous = _read_holder(fd)
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (Holder.me().dumps() + "\n").encode())
        except OSError as exc:
            os.close(fd)
            raise io_error(self.path, exc) from None
        self.fd = fd
        _HELD_FDS.add(fd)
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        _HELD_FDS.discard(fd)
        try:
            os.ftruncate(fd, 0)  # nobody holds it now (a full disk cannot refuse a truncate)
        except OSError:
            pass
        os.close(fd)  # closing drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(run_dir: Path) -> Holder | None | bool:
    """Who holds the run's lock now: the Holder, True if held but unnamed, None if free."""
    if fcntl is None:  # pragma: no cover
        return None
    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except OSError:
        return None  # no lock file: never locked (or a run from before locking)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        named = _read_holder(fd)
        os.close(fd)
        return named or True
    except OSError:
        os.close(fd)
        return None
    os.close(fd)
    return None


# --------------------------------------------------------------------------- the manifest


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """The run's manifest, or RunError with one line naming the file and what to do."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        raise RunError(f"{run_dir}: not a run directory (no {MANIFEST})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        text = None
    except OSError as exc:
        raise io_error(path, exc, "cannot read") from None
    try:
        data = json.loads(text) if text is not None else None
    except ValueError as exc:
        data, why = None, f"not valid JSON ({exc})"
    else:
        why = "not UTF-8" if text is None else "not a JSON object with a `config`"
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise RunError(
            f"{path}: damaged manifest: {why}; restore it from a copy, or start a new run "
            "(its trial records cannot be told apart from another config's without it)"
        )
    _restore_grid_order(Path(run_dir), data["config"])
    return data


def _restore_grid_order(run_dir: Path, config: dict[str, Any]) -> None:
    """Put the stored config's grid keys back in the order the run's records name them.

    Manifests written before nested order was kept hold the grid sorted by key, while the
    records' cell ids name the keys in the order the run was given them; re-planning in the
    sorted order would then name no recorded trial. The first record's cell id says the
    order (a grid key's label is found where the id names it: at the start or after a
    comma); keys it does not name keep their place after those it does."""
    grid = config.get("grid")
    if not isinstance(grid, dict) or len(grid) < 2:
        return
    try:
        with (run_dir / TRIALS).open("rb") as fh:
            first = json.loads(fh.readline() or b"{}")
    except (OSError, ValueError):
        return
    cid = first.get("cell_id") if isinstance(first, dict) else None
    if not isinstance(cid, str):
        return
    labels = config.get("labels") if isinstance(config.get("labels"), dict) else {}

    def where(key: str) -> int:
        name = f"{labels.get(key, key)}="
        found = [m.start() for m in re.finditer(re.escape(name), cid)]
        at = [i for i in found if i == 0 or cid[i - 1] == ","]
        return at[0] if at else len(cid)

    rank = {k: (where(k), i) for i, k in enumerate(grid)}
    config["grid"] = {k: grid[k] for k in sorted(grid, key=rank.__getitem__)}


#: os.replace, through a name tests can replace to inject a read-only file system.
_replace = os.replace


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest atomically (a crash leaves the old or the new one, never half)."""
    path = Path(run_dir) / MANIFEST
    tmp = path.with_name(f"{MANIFEST}.{os.getpid()}.tmp")  # per process: report may settle too
    try:
        # Top-level keys sorted; nested mappings keep their order: the config's grid keys
        # (and each cell's keys) in the order given are the order cell ids name them in,
        # so re-planning from the manifest must see that order (see `read_manifest`).
        text = json.dumps(dict(sorted(manifest.items())), indent=2)
        tmp.write_text(text + "\n", encoding="utf-8")
        _replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise io_error(path, exc) from None


def settle_status(run_dir: Path, manifest: dict[str, Any]) -> str:
    """The run's real status: a manifest that says `running` while nobody holds the lock
    belongs to a killed process, so it is `interrupted`. The correction is written back
    when the directory is writable (under a shared lock, so never over a live owner)."""
    status = str(manifest.get("status", "?"))
    if status != "running" or fcntl is None:
        return status
    path = Path(run_dir) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        fd = None  # no lock file: a run from before locking; nobody can own it now
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return "running"  # a live owner holds it
        manifest["status"] = "interrupted"
        manifest.setdefault("interrupted_detected_at", _now())
        try:
            write_manifest(run_dir, manifest)
        except RunIOError:
            pass  # read-only: the status is still reported right
        return "interrupted"
    finally:
        if fd is not None:
            os.close(fd)


# --------------------------------------------------------------------------- trial records

_KEY_RE = re.compile(r'"key"\s*:\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class DamagedLine:
    """A line of trials.jsonl that is not a usable trial record."""

    lineno: int
    reason: str
    key: str | None  # the trial it seems to hold, when that can still be read
    text: str


@dataclass(frozen=True)
class ForeignRecord:
    """A trial record of another config (another name or config hash)."""

    lineno: int
    config: str
    config_hash: str | None
    why: str  # what differs: the name, the hash, or a key the config does not plan


@dataclass
class Records:
    """What trials.jsonl holds: whole records (first of each key), damaged lines, records of
    another config, and whether the last line was torn (a crash mid-write)."""

    records: list[TrialRecord] = field(default_factory=list)
    damaged: list[DamagedLine] = field(default_factory=list)
    foreign: list[ForeignRecord] = field(default_factory=list)
    torn_tail: bool = False

    def keys(self) -> set[str]:
        return {r["key"] for r in self.records}


def _record_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not a trial record"
    for name, kind in RECORD_FIELDS.items():
        if name not in data:
            return f"not a trial record (no {name!r})"
        value = data[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"not a trial record ({name!r} is {type(value).__name__})"
    return None


def _recover_key(text: str, data: Any) -> str | None:
    if isinstance(data, dict) and isinstance(data.get("key"), str):
        return data["key"]
    m = _KEY_RE.search(text)
    if m is None:
        return None
    try:
        return str(json.loads(f'"{m.group(1)}"'))
    except ValueError:
        return None


def scan_records(
    path: Path,
    config_name: str | None = None,
    config_hash: str | None = None,
    planned: Collection[str] | None = None,
) -> Records:
    """Read trials.jsonl line by line without raising on bad content.

    A record is foreign when its `config` differs from `config_name`, its `config_hash`
    (records written since hashes were recorded) differs from `config_hash`, or its key is
    not in `planned`. A repeated key is a damaged line (the first record counts).
    """
    out = Records()
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return out
    except OSError as exc:
        raise io_error(path, exc, "cannot read") from None
    lines = raw.split(b"\n")
    if lines and lines[-1]:
        out.torn_tail = True  # no newline yet: a write in progress or cut by a crash
    first_seen: dict[str, int] = {}
    for lineno, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        text = line.decode("utf-8", "replace")
        try:
            data = json.loads(line)
        except ValueError as exc:
            reason = f"not JSON ({exc.__class__.__name__}: {exc})" if line.isascii() else "not JSON"
            out.damaged.append(DamagedLine(lineno, reason, _recover_key(text, None), text))
            continue
        problem = _record_problem(data)
        if problem is not None:
            out.damaged.append(DamagedLine(lineno, problem, _recover_key(text, data), text))
            continue
        name, digest = data.get("config"), data.get("config_hash")
        why = None
        if config_name is not None and name is not None and name != config_name:
            why = "another config name"
        elif config_hash is not None and digest is not None and digest != config_hash:
            why = "another config hash"
        elif planned is not None and data["key"] not in planned:
            why = f"trial {data['key']!r} is not one this config plans"
        if why is not None:
            out.foreign.append(ForeignRecord(lineno, str(name), digest, why))
            continue
        key = data["key"]
        if key in first_seen:
            reason = f"repeats the trial of line {first_seen[key]} ({key})"
            out.damaged.append(DamagedLine(lineno, reason, key, text))
            continue
        first_seen[key] = lineno
        out.records.append(data)
    return out


def foreign_message(
    path: Path, foreign: list[ForeignRecord], config_name: str | None, config_hash: str | None
) -> str:
    """One line refusing to mix another config's records into this run's tables."""
    first = foreign[0]
    theirs = f"config {first.config!r}" + (f" (hash {first.config_hash})" if first.config_hash else "")
    more = f" and {len(foreign) - 1} more line(s)" if len(foreign) > 1 else ""
    return (
        f"{path}: line {first.lineno}{more} hold records of {theirs} ({first.why}), but this "
        f"run is config {config_name!r} (hash {config_hash}); refusing to mix them into its "
        "tables: move those lines out of the file"
    )


def damaged_summary(damaged: list[DamagedLine], limit: int = 8) -> str:
    """`3 damaged lines (12: not JSON, 40: ..., ...)`."""
    shown = ", ".join(f"{d.lineno}: {d.reason}" for d in damaged[:limit])
    more = f", ... {len(damaged) - limit} more" if len(damaged) > limit else ""
    return f"{len(damaged)} damaged line{'s' if len(damaged) != 1 else ''} ({shown}{more})"


def quarantine(run_dir: Path, damaged: list[DamagedLine]) -> Path:
    """Move damaged lines out of trials.jsonl into trials.damaged.jsonl (kept, with their line
    numbers and why), rewriting trials.jsonl atomically without them."""
    run_dir = Path(run_dir)
    path, aside = run_dir / TRIALS, run_dir / DAMAGED
    drop = {d.lineno for d in damaged}
    try:
        lines = path.read_bytes().split(b"\n")
        kept = b"".join(line + b"\n" for n, line in enumerate(lines[:-1], 1) if n not in drop)
        stamp = _now()
        with open(aside, "a", encoding="utf-8") as fh:
            for d in damaged:
                entry = {"line": d.lineno, "reason": d.reason, "key": d.key, "text": d.text}
                fh.write(json.dumps({**entry, "moved_at": stamp}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        tmp = path.with_name(f"{TRIALS}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(kept + lines[-1])
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise io_error(path, exc) from None
    return aside


# --------------------------------------------------------------------------- listing runs


@dataclass(frozen=True)
class RunInfo:
    """One past run as `atomix runs` lists it (from its manifest; lines counted, not parsed)."""

    run_dir: Path
    config: str
    started_at: str
    done: int
    planned: int
    status: str


def count_lines(path: Path) -> int:
    """How many lines a file holds (0 if it cannot be read): a run's trial count."""
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return 0


def list_runs(results: Path) -> list[RunInfo]:
    """Every run under `results/<config>/<run-id>/`, oldest first; a damaged manifest is
    listed with status `damaged manifest` rather than hidden."""
    out: list[RunInfo] = []
    results = Path(results)
    if not results.is_dir():
        return out
    for manifest_path in results.glob(f"*/*/{MANIFEST}"):
        run_dir = manifest_path.parent
        try:
            manifest = read_manifest(run_dir)
        except RunError:
            out.append(RunInfo(run_dir, run_dir.parent.name, "?", 0, 0, "damaged manifest"))
            continue
        status = settle_status(run_dir, manifest)
        out.append(
            RunInfo(
                run_dir,
                str(manifest.get("config_name") or run_dir.parent.name),
                str(manifest.get("started_at") or "?"),
                count_lines(run_dir / TRIALS),
                int(manifest.get("trials_planned") or 0),
                status,
            )
        )
    return sorted(out, key=lambda r: (r.started_at, str(r.run_dir)))
