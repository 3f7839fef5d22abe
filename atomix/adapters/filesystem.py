"""A file store: atomic whole-file writes and deletes under one root directory."""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from atomix.adapters.oplog import OpLog, fsync_dir, truncate_torn_tail
from atomix.scope_kinds import fs_scope

SUBSTRATE = "fs"
#: The store's own directory under root: never user data, never in a snapshot.
META_DIR = ".atomix"
JOURNAL = "applied"
#: Appends to the journal and its compaction (`prune_keys`) hold an flock on this file, so
#: that a compaction in another process never loses an append.
JOURNAL_LOCK = "applied.lock"
TMP_SUFFIX = ".atomix-tmp"
# A temporary file's name ends with its writer's pid: `.<name>.<random>.<pid>.atomix-tmp`.
_TMP_PID = re.compile(r"\.(\d+)\.atomix-tmp\Z")
#: Mode of a file the store creates (a replaced file keeps its own mode). Fixed rather than taken
#: from the umask, because reading the umask means setting it, which races with other threads.
NEW_FILE_MODE = 0o644


class FileStore:
    """Whole-file writes and deletes on real files under ``root``, each atomic and durable.

    Guarantees:
    - A write is all or nothing: data goes to a temporary file in the target's directory, is
      fsynced, and is renamed over the target with `os.replace`; the directory is then fsynced. A
      failure at any step leaves the previous content and no temporary file behind (a process
      killed mid-write can leave a ``.<name>.*.<pid>.atomix-tmp`` file, never a half-written
      target; `sweep_temp_files` removes those of dead writers, and recovery calls it).
    - Paths resolve (``..``, symlinks and, with ``casefold=True``, letter case) to one real file
      under ``root``; anything resolving outside root, to root itself or into ``.atomix/`` is
      refused with ValueError.
    - With a key, a mutation is applied at most once per journal: the applied keys are appended,
      fsynced, to ``<root>/.atomix/applied`` and reloaded at open. `prune_keys` removes the keys
      of a finished run (recovery does, once no retry can come for them).

    Crash window (honest): the journal entry is written *after* the rename, because a file and a
    journal cannot be updated in one atomic step. A crash between the two leaves the effect applied
    but its key unrecorded, and a retry with that key applies it a second time. For a whole-file
    write of the same data the second application changes nothing, but if another write to the
    path landed in between, the retry overwrites it. (Journalling first would trade this for the
    opposite failure: a key recorded for an effect that never happened, i.e. a lost effect.)

    Thread-safe within one instance (one lock orders mutations and their log records); use one
    `FileStore` per root per process, since instances do not see each other's new keys.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        oplog: OpLog | None = None,
        casefold: bool = False,
        durable: bool = True,
    ) -> None:
        root_path = Path(root)
        root_path.mkdir(parents=True, exist_ok=True)
        self._root = Path(os.path.realpath(root_path))
        self._oplog = oplog
        self._casefold = casefold
        # durable=False skips the fsyncs (writes stay atomic via rename): for throwaway trial
        # directories, where surviving power loss is not the property under test.
        self._durable = durable
        self._lock = threading.RLock()
        self._journal = self._root / META_DIR / JOURNAL
        self._keys: set[str] = set()
        if self._journal.exists():
            truncate_torn_tail(self._journal)
            for line in self._journal.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    self._keys.add(json.loads(line)["key"])

    @property
    def root(self) -> Path:
        """The real (symlink-free) root directory."""
        return self._root

    @property
    def casefold(self) -> bool:
        """Whether this store treats names case-insensitively (a case-insensitive substrate)."""
        return self._casefold

    # ---- paths and scopes ---------------------------------------------------------------------

    def resolve(self, path: Path | str) -> Path:
        """The real absolute path ``path`` names; ValueError if it is not a file path under root."""
        p = Path(path)
        if not p.is_absolute():
            p = self._root / p
        real = Path(os.path.realpath(p))
        if self._casefold:
            real = self._match_case(real)
        self._check_inside(path, real)
        return real

    def relative(self, path: Path | str) -> str:
        """The posix path of ``path`` relative to root (the key it has in `snapshot`)."""
        return self.resolve(path).relative_to(self._root).as_posix()

    def scope(self, path: Path | str) -> str:
        """The canonical scope string of ``path``."""
        return str(fs_scope(self.resolve(path), casefold=self._casefold))

    # ---- reads ----------------------------------------------------------------------------------

    def read(
        self, path: Path | str, *, log_read: bool = False, meta: Mapping[str, Any] | None = None
    ) -> bytes | None:
        """The file's bytes, or None if there is no regular file there."""
        with self._lock:
            real = self.resolve(path)
            data = _read_file(real)
            if log_read and self._oplog is not None:
                self._log(real, "read", None, meta)
            return data

    def read_text(
        self,
        path: Path | str,
        *,
        encoding: str = "utf-8",
        log_read: bool = False,
        meta: Mapping[str, Any] | None = None,
    ) -> str | None:
        """The file decoded as text, or None if there is no regular file there."""
        data = self.read(path, log_read=log_read, meta=meta)
        return None if data is None else data.decode(encoding)

    def exists(self, path: Path | str) -> bool:
        """Whether a regular file is at ``path``."""
        return self.resolve(path).is_file()

    def before_image(self, path: Path | str) -> bytes | None:
        """The current content (None: absent), for a caller that must later restore it.

        Restoring is `write(path, image)`, or `delete(path)` when the image is None. Not logged.
        """
        return _read_file(self.resolve(path))

    def snapshot(self) -> dict[str, bytes]:
        """Every regular file under root except ``.atomix/``, by relative posix path.

        Read from the disk itself: this is the substrate's ground truth. Symlinks are not regular
        files and are left out (a target under root appears under its own name).
        """
        out: dict[str, bytes] = {}
        with self._lock:
            for dirpath, dirnames, filenames in os.walk(self._root):
                here = Path(dirpath)
                if here == self._root:
                    dirnames[:] = [d for d in dirnames if not self._is_meta_name(d)]
                for name in filenames:
                    full = here / name
                    if stat.S_ISREG(os.lstat(full).st_mode):
                        out[full.relative_to(self._root).as_posix()] = full.read_bytes()
        return dict(sorted(out.items()))

    def applied_keys(self) -> frozenset[str]:
        """The idempotency keys recorded in the journal so far."""
        with self._lock:
            return frozenset(self._keys)

    # ---- mutations ------------------------------------------------------------------------------

    def write(
        self,
        path: Path | str,
        data: str | bytes,
        *,
        key: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Atomically replace (or create) the file with ``data``; False if ``key`` was applied.

        ``str`` data is written as UTF-8. Parent directories are created.
        """
        with self._lock:
            # Resolve under the lock: with casefold, which spelling exists can change.
            real = self.resolve(path)
            if self._dedup(real, key, meta):
                return False
            _atomic_write(real, _encode(data), self._root, durable=self._durable)
            self._record(real, "write", key, meta)
            return True

    def delete(
        self, path: Path | str, *, key: str | None = None, meta: Mapping[str, Any] | None = None
    ) -> bool:
        """Remove the file; False if ``key`` was applied.

        Deleting an absent file is still an applied (blind) write to its scope: it returns True,
        is logged as ``"delete"`` and records its key, so a late duplicate cannot delete a file
        created afterwards. A symlink resolves like any alias: its target is deleted.
        """
        with self._lock:
            real = self.resolve(path)
            if self._dedup(real, key, meta):
                return False
            if real.is_dir():
                raise IsADirectoryError(f"{real}: FileStore deletes files, not directories")
            try:
                os.unlink(real)
            except FileNotFoundError:
                pass
            else:
                if self._durable:
                    fsync_dir(real.parent)
            self._record(real, "delete", key, meta)
            return True

    # ---- housekeeping ---------------------------------------------------------------------------

    def prune_keys(self, prefix: str) -> int:
        """Remove every applied key that starts with `prefix` from the journal (rewritten
        atomically); returns how many went. Only for keys no retry can come for any more
        (recovery prunes a finished run's, ``<run>:``): a pruned key's effect would apply again."""
        with self._lock:
            if not self._journal.exists():
                return 0
            with self._journal_locked():
                truncate_torn_tail(self._journal)
                lines = self._journal.read_text(encoding="utf-8").splitlines(keepends=True)
                keep = [ln for ln in lines if ln.strip() and not json.loads(ln)["key"].startswith(prefix)]
                gone = sum(1 for ln in lines if ln.strip()) - len(keep)
                if gone:
                    _atomic_write(self._journal, "".join(keep).encode(), self._root, durable=self._durable)
            self._keys = {k for k in self._keys if not k.startswith(prefix)}
            return gone

    def sweep_temp_files(self) -> int:
        """Remove the temporary files under root that writers killed mid-write left behind
        (their pid is no longer alive; a name without a pid is from an older version);
        returns how many. A live writer's temporary file is never touched."""
        removed = 0
        for path in self._temp_files():
            match = _TMP_PID.search(path.name)
            if match is not None and _alive(int(match.group(1))):
                continue
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed

    def _temp_files(self) -> Iterator[Path]:
        for dirpath, dirnames, filenames in os.walk(self._root):
            here = Path(dirpath)
            if here == self._root:
                dirnames[:] = [d for d in dirnames if not self._is_meta_name(d)]
            for name in filenames:
                if name.endswith(TMP_SUFFIX):
                    yield here / name

    def _journal_locked(self) -> _FileLock:
        return _FileLock(self._journal.parent / JOURNAL_LOCK)

    # ---- internals ------------------------------------------------------------------------------

    def _dedup(self, real: Path, key: str | None, meta: Mapping[str, Any] | None) -> bool:
        if key is None or key not in self._keys:
            return False
        self._log(real, "dedup", key, meta)
        return True

    def _record(
        self, real: Path, kind: str, key: str | None, meta: Mapping[str, Any] | None
    ) -> None:
        """After the mutation: journal its key (durably), then log it."""
        if key is not None:
            entry = {"key": key, "kind": kind, "path": real.relative_to(self._root).as_posix()}
            self._journal.parent.mkdir(exist_ok=True)
            with self._journal_locked():
                created = not self._journal.exists()
                with open(self._journal, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(entry, sort_keys=True) + "\n")
                    fh.flush()
                    if self._durable:
                        os.fsync(fh.fileno())
            if created and self._durable:
                fsync_dir(self._journal.parent)
            self._keys.add(key)
        self._log(real, kind, key, meta)

    def _log(self, real: Path, kind: str, key: str | None, meta: Mapping[str, Any] | None) -> None:
        if self._oplog is not None:
            scope = str(fs_scope(real, casefold=self._casefold))
            self._oplog.append(SUBSTRATE, scope, kind, key=key, meta=meta)

    def _is_meta_name(self, name: str) -> bool:
        return (name.casefold() if self._casefold else name) == META_DIR

    def _check_inside(self, given: Path | str, real: Path) -> None:
        if real == self._root or not real.is_relative_to(self._root):
            raise ValueError(f"{given!s}: resolves to {real}, not a file under {self._root}")
        if self._is_meta_name(real.relative_to(self._root).parts[0]):
            raise ValueError(f"{given!s}: {META_DIR}/ is the store's own directory")

    def _match_case(self, real: Path) -> Path:
        """Map each component below root to an existing entry equal up to case, if there is one.

        This makes a case-sensitive disk behave like a case-preserving, case-insensitive one (the
        first spelling used creates the name; later spellings find it).
        """
        if not real.is_relative_to(self._root):
            return real
        current = self._root
        parts = real.relative_to(self._root).parts
        for i, part in enumerate(parts):
            if (current / part).exists() or not current.is_dir():
                current = current / part
                continue
            folded = part.casefold()
            matches = sorted(n for n in os.listdir(current) if n.casefold() == folded)
            if len(matches) > 1:
                raise ValueError(f"{real}: {part!r} matches {matches} on a case-insensitive store")
            if not matches:
                # Nothing further down can exist: keep the caller's spelling for new names.
                return Path(current, *parts[i:])
            # The matched entry may itself be a symlink: resolve again from here.
            current = Path(os.path.realpath(current / matches[0]))
        return current


def _encode(data: str | bytes) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"file data must be str or bytes, not {type(data).__name__}")


def _read_file(real: Path) -> bytes | None:
    try:
        return real.read_bytes() if real.is_file() else None
    except FileNotFoundError:
        return None


def _makedirs_durable(directory: Path, root: Path, durable: bool = True) -> None:
    """Create ``directory`` and missing parents below ``root``, fsyncing each new entry's parent."""
    missing: list[Path] = []
    d = directory
    while d != root and not d.is_dir():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        if durable:
            fsync_dir(d.parent)


def _atomic_write(target: Path, data: bytes, root: Path, *, durable: bool = True) -> None:
    """Write ``data`` to ``target`` via a fsynced temp file and `os.replace`, then fsync the dir."""
    _makedirs_durable(target.parent, root, durable)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = NEW_FILE_MODE
    fd, tmp_name = tempfile.mkstemp(
        # The name is cut so that the temp name stays under NAME_MAX for long target names.
        dir=target.parent,
        prefix=f".{target.name[:64]}.",
        suffix=f".{os.getpid()}{TMP_SUFFIX}",  # whose it is: see FileStore.sweep_temp_files
    )
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        # Whatever failed (including KeyboardInterrupt), the target still has its old content;
        # the temp file must not survive as clutter.
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(target.parent)


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (a pid reused since only keeps a file longer)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's live process, or not a pid we can ask about: keep it
    return True


class _FileLock:
    """An exclusive flock on `path` for the length of a ``with`` block (and this thread's
    store lock, which the caller holds, orders threads within the process)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    def __enter__(self) -> _FileLock:
        self._path.parent.mkdir(exist_ok=True)
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        if _fcntl is not None:
            _fcntl.flock(self._fd, _fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # closing drops the flock
        self._fd = -1


try:
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - not POSIX: only the in-process lock orders writers
    _fcntl = None  # type: ignore[assignment]
