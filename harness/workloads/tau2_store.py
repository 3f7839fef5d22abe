"""A tau2 domain's DB as a trial substrate (`Tau2Store`), and the parts every tool of such a
store shares as a harness tool (`store_tool_parts`).

Every call of every mode on a tau2 domain goes through its store's `call`, which runs the
tool with tau2's semantics on the trial's own DB, deduplicates by idempotency key, and writes
the op log (reads and writes per scope) below all mechanisms. A domain's store subclasses
`Tau2Store`, names its substrate, tools, tool runner and refusal error, and may add its own
bookkeeping around each application (`_apply`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

from atomix.adapters import OpLog
from harness.workloads.retail.cow import db_sha256, fork_db
from harness.workloads.retail.tools import Scopes
from harness.world.substrates import TrialEnv
from harness.world.tooling import Delivery, ToolError

__all__ = ["StoreTool", "Tau2Store", "store_tool_parts"]

ScopeFn = Callable[[TrialEnv, dict[str, Any]], list[str]]
RunFn = Callable[[TrialEnv, dict[str, Any], Delivery], Any]


class StoreTool(Protocol):
    """What a store needs of a domain's tool: its name, whether it writes, and its scopes."""

    name: str
    writes: bool

    def scopes(self, db: Any, args: Mapping[str, Any]) -> Scopes: ...


class Tau2Store:
    """One trial's DB of a tau2 domain. A call with a key already applied returns the first
    result and changes nothing; a refused call (the domain's own error) is a ToolError.

    `db` is a `cow_db` (or any plain-dict DB); `snapshot()` hashes it as `db_sha256` does.
    """

    #: The substrate name the op log records.
    substrate: ClassVar[str]
    #: The domain's tools by name.
    tools: ClassVar[Mapping[str, StoreTool]]
    #: The error the domain's tools raise when they refuse a call.
    tool_error: ClassVar[type[Exception]]

    def __init__(self, db: dict[str, Any], oplog: OpLog | None = None) -> None:
        self.db = db
        self._oplog = oplog
        self._results: dict[str, Any] = {}
        self._sha: str | None = None  # cached until the next write

    @staticmethod
    def run_tool(db: dict[str, Any], name: str, args: dict[str, Any]) -> Any:
        """Run tool `name` on `db` (the domain's `call_tool`)."""
        raise NotImplementedError

    def _log(self, scope: str, kind: str, key: str | None, meta: Mapping[str, Any] | None) -> None:
        if self._oplog is not None:
            self._oplog.append(self.substrate, scope, kind, key=key, meta=meta)

    def _run(self, db: dict[str, Any], name: str, args: dict[str, Any]) -> Any:
        try:
            return self.run_tool(db, name, args)
        except self.tool_error as exc:
            raise ToolError(str(exc)) from exc

    def _apply(self, name: str, args: dict[str, Any], writes: list[str], meta: Mapping[str, Any]) -> Any:
        """Apply a call not applied before to the trial's DB (a domain adds its bookkeeping)."""
        return self._run(self.db, name, args)

    def call(self, name: str, args: dict[str, Any], *, key: str | None, meta: Mapping[str, Any]) -> Any:
        reads, writes = self.tools[name].scopes(self.db, args)
        if key is not None and key in self._results:
            for scope in writes:
                self._log(scope, "dedup", key, meta)
            return copy.deepcopy(self._results[key])
        result = self._apply(name, args, writes, meta)
        for scope in reads:
            self._log(scope, "read", None, meta)
        if writes:
            self._sha = None
        for scope in writes:
            self._log(scope, "write", key, meta)
        if key is not None and writes:
            self._results[key] = copy.deepcopy(result)
        return result

    def check(self, name: str, args: dict[str, Any]) -> None:
        """Validate a write's preconditions without changing anything (a TCC try)."""
        # A scratch copy of the current state (cheap: copy-on-write), so that nothing the
        # tool does can reach the trial's DB.
        self._run(fork_db(self.db), name, args)

    def _hash(self) -> str:
        return db_sha256(self.db)

    def snapshot(self) -> dict[str, Any]:
        if self._sha is None:
            self._sha = self._hash()
        return {"db_sha256": self._sha}


def store_tool_parts(tool: StoreTool, store: Callable[[TrialEnv], Tau2Store]) -> tuple[ScopeFn, ScopeFn, RunFn]:
    """(reads, writes, run) of `tool` as a harness tool on the trial's store (`store(env)`):
    its scopes on the store's current DB, and a call through the store with the delivery's
    key and metadata."""
    name = tool.name

    def reads(env: TrialEnv, a: dict[str, Any]) -> list[str]:
        return tool.scopes(store(env).db, a)[0]

    def writes(env: TrialEnv, a: dict[str, Any]) -> list[str]:
        return tool.scopes(store(env).db, a)[1]

    def run(env: TrialEnv, a: dict[str, Any], d: Delivery) -> Any:
        return store(env).call(name, a, key=d.key, meta=d.meta)

    return reads, writes, run
