"""The harness's own errors, in a module with no heavy imports: the command line imports
them at start-up, and `atomix --version` must not pay for pydantic, scipy or matplotlib."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class ConfigError(ValueError):
    """A config is wrong: the message names the file, the key path and what is allowed."""

    def __init__(self, path: str | Path, problems: Sequence[str]) -> None:
        self.path = str(path)
        self.problems = list(problems)
        super().__init__("\n".join(f"{self.path}: {p}" for p in self.problems))


class RunError(RuntimeError):
    """A run cannot start or resume (e.g. the run directory belongs to another config)."""
