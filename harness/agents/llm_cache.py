"""An on-disk cache of chat completions, keyed by a hash of the canonical request.

A run that asks the same request again (a resumed run, a repeated run into another out dir,
another mode whose conversation has not diverged yet) reads the stored answer instead of
calling the model: it costs no second call and gets the same answer, so its records are the
same. The key covers everything that shapes the answer: the endpoint (`base_url`), the model,
the messages, the tools, `tool_choice`, temperature, seed and max_tokens (the API key does
not: it only authenticates). Two servers behind different URLs never share answers.

Layout: `<root>/<first 2 hex digits>/<sha256>.json`, each file `{"request", "response"}`.
A write goes to a temporary file in the same directory, is flushed to disk, then linked into
place: an interrupted run never leaves a half-written entry, and when two processes answer
the same request at once, the first entry to land wins and both use it (a later writer
reads it back), so every record of a run agrees with the cache. The one exception is an
entry the writer says its answer supersedes (`put(..., supersedes=)`: the LLM agent's
cached time-out, which a later answer under a longer time-out replaces).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["CACHE_VERSION", "CompletionCache", "default_cache_dir", "request_key"]

# Part of every key: a change of what an entry holds starts a fresh cache, never misreads one.
CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/atomix/llm`, or `~/.cache/atomix/llm`: shared by every run of the
    user, so a repeated run into another out dir makes no second call."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "atomix" / "llm"


def canonical(request: Mapping[str, Any]) -> str:
    return json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def request_key(request: Mapping[str, Any]) -> str:
    """The sha256 of the canonical JSON of `request` (with the cache format version)."""
    blob = canonical({"v": CACHE_VERSION, **request}).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


class CompletionCache:
    """Completions stored under `root`. Guarantees: `get` returns only whole entries made for
    exactly this request; `put` never exposes a partial file, and returns the entry that
    the cache holds afterwards (the first one written for the request)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        path = self._path(request_key(request))
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None  # unreadable (e.g. edited by hand): asked again and replaced
        if not isinstance(entry, dict) or entry.get("request") != json.loads(canonical(request)):
            return None
        response = entry.get("response")
        return response if isinstance(response, dict) else None

    def put(
        self, request: Mapping[str, Any], response: Mapping[str, Any],
        supersedes: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """Store `response`; the entry the cache holds afterwards. An existing entry wins,
        unless `supersedes(existing)` says `response` replaces it."""
        path = self._path(request_key(request))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp: str | None = _write_tmp(path, canonical({"request": request, "response": response}))
        except OSError as exc:
            raise OSError(f"{path}: cannot write to the completion cache: {exc}") from exc
        try:
            try:
                os.link(tmp, path)  # refuses to overwrite: the first entry to land wins
            except FileExistsError:
                existing = self.get(request)
                if existing is not None and not (
                    supersedes is not None and existing != response and supersedes(existing)
                ):
                    return existing
                os.replace(tmp, path)  # unreadable, or superseded: ours replaces it
                tmp = None
            except OSError:
                os.replace(tmp, path)  # a file system without hard links: the last one wins
                tmp = None
        finally:
            if tmp is not None:
                os.unlink(tmp)
        return json.loads(canonical(response))


def _write_tmp(path: Path, text: str) -> str:
    """`text` in a new temporary file beside `path`, on disk; its name."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp
