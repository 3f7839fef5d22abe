"""Exceptions raised by the Atomix runtime."""

from __future__ import annotations


class AtomixError(Exception):
    """Base class of every error the runtime raises on purpose."""


class ToolDefinitionError(AtomixError, ValueError):
    """Tool metadata is wrong; raised when the tool is defined, naming tool and field."""

    def __init__(self, tool: str, field: str, message: str) -> None:
        self.tool = tool
        self.field = field
        super().__init__(f"tool {tool!r}: field {field!r}: {message}")


class ScopeError(AtomixError, ValueError):
    """A scope cannot be canonicalised."""


class IllegalTransition(AtomixError):
    """A lifecycle event that the transaction's current state does not allow.

    The transaction is left exactly as it was.
    """

    def __init__(self, txid: int, state: str, event: str, why: str = "") -> None:
        self.txid = txid
        self.state = state
        self.event = event
        msg = f"transaction {txid}: event {event!r} is not allowed in state {state!r}"
        super().__init__(f"{msg}: {why}" if why else msg)


class UnknownTransaction(AtomixError, KeyError):
    """The manager has no transaction with this id."""


class TransactionAborted(AtomixError):
    """The transaction was aborted; `source` says why, `settlement` what happened to its effects."""

    def __init__(self, txid: int, source: str, detail: str = "", settlement: object | None = None) -> None:
        self.txid = txid
        self.source = source
        self.detail = detail
        self.settlement = settlement
        msg = f"transaction {txid} aborted: {source}"
        super().__init__(f"{msg} ({detail})" if detail else msg)


class CommitIncomplete(AtomixError):
    """The transaction committed, but an effect could not be applied or delivered after its
    retries. `settlement.failed_applies` names the effects and `settlement.errors` holds each
    one's exception; the rest of the commit stands (its effects landed, by key, at most once).
    """

    def __init__(self, settlement: object) -> None:
        self.settlement = settlement
        failed = getattr(settlement, "failed_applies", ())
        errors = getattr(settlement, "errors", {})
        first = next((errors[k] for k in failed if k in errors), None)
        why = f": {type(first).__name__}: {first}" if first is not None else ""
        txid = getattr(settlement, "txid", "?")
        super().__init__(
            f"transaction {txid} committed, but {len(failed)} effect(s) did not land{why}"
        )


class OutsideTransaction(AtomixError):
    """A tool was called outside every transaction where the runtime may not auto-commit it:
    under `Runtime(strict=True)`, or while a transaction of the runtime is open elsewhere, so
    that the call may belong to it (a worker thread that did not inherit its context)."""
