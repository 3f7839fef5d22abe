"""The durable log's failed deliveries: the retry queue and the dead letters.

A delivery (a gated release) that failed at commit is kept, not dropped: its attempts and
last error go to the ``deliveries`` table, and the process that committed it retries it with
backoff in a thread of its own (``retry_backoff`` doubling per attempt, at most
``retry_backoff_max``), `atomix recover` once per run, always under the same idempotency key,
until it lands or ``max_delivery_attempts`` deliveries in all (the commit's own counts as the
first) move it to ``dead_letters``. A buffered write that failed at commit is dead-lettered at
once: retried later it could overwrite what a later transaction wrote to the same resource.

Guarantees: a failed delivery is in ``deliveries`` or ``dead_letters`` (never neither) from
the transaction's end until it lands; its transaction's rows stay until its last queued
retry has finished; closing the log stops the retry thread and leaves the queued retries in
the log for the next start or `atomix recover`. `DeliveryRetries` is a mixin of
`atomix.log.TxLog` and runs under its lock; this module never imports `atomix.log`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from atomix.effects import Effect, EffectClass
from atomix.log_format import FAILED, RELEASED, LoggedSession, error_text

__all__ = ["DeliveryRetries", "dead_rows", "forget_rows"]

#: A transaction's identity in the log: (run_id, txid).
Ident = tuple[str, int]


def dead_rows(ident: Ident, key: str, attempts: int, why: str) -> list[tuple[str, Any]]:
    """The statements that move one effect to ``dead_letters`` (with its redo record)."""
    where = (*ident, key)
    return [
        ("INSERT OR REPLACE INTO dead_letters SELECT run_id, txid, key, tool, class, redo, "
         "?, ?, ? FROM effects WHERE run_id = ? AND txid = ? AND key = ?",
         (attempts, why, time.time(), *where)),
        ("DELETE FROM effects WHERE run_id = ? AND txid = ? AND key = ?", where),
        ("DELETE FROM deliveries WHERE run_id = ? AND txid = ? AND key = ?", where),
    ]


def forget_rows(run_id: str, txid: int) -> list[tuple[str, Any]]:
    """The statements that delete a finished transaction's rows."""
    return [
        ("DELETE FROM effects WHERE run_id = ? AND txid = ?", (run_id, txid)),
        ("DELETE FROM txs WHERE run_id = ? AND txid = ?", (run_id, txid)),
        ("DELETE FROM deliveries WHERE run_id = ? AND txid = ?", (run_id, txid)),
    ]


class DeliveryRetries:
    """The failed-delivery half of `atomix.log.TxLog` (see the module docstring).

    Guarantees: each failed gated release is retried under its own key, no earlier than its
    backoff allows, and counted in ``deliveries`` after every attempt; it lands (released),
    or is dead-lettered after ``max_delivery_attempts`` deliveries in all.
    """

    # What the host (TxLog) provides.
    location: str
    closed: bool
    errors: list[Exception]
    max_delivery_attempts: int
    retry_backoff: float
    retry_backoff_max: float
    _lock: threading.Lock
    _live: dict[Ident, str]

    if TYPE_CHECKING:

        def _write(self, statements: Iterable[tuple[str, Any]], *, sync: bool = False) -> None: ...

        def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def _init_retries(self) -> None:
        """The empty retry queue; the host calls it once its lock exists."""
        # Effects of live transactions whose delivery failed at commit, by transaction.
        self._failed: dict[Ident, list[Effect]] = {}
        # The retry queue of this process's failed deliveries: (due, n, ident, effect).
        self._retries: list[tuple[float, int, Ident, Effect]] = []
        self._retry_n = itertools.count()
        self._retry_wake = threading.Condition(self._lock)
        self._retrier: threading.Thread | None = None

    def _keep_failed(
        self, tx: LoggedSession, failed: list[Effect], errors: Mapping[str, BaseException]
    ) -> None:
        """Keep a transaction whose deliveries failed at commit: gated releases are queued for
        a retry, buffered writes are dead-lettered (see the module docstring)."""
        ident = (tx.co.run_id, tx.txid)
        retry = [
            e for e in failed
            if e.effect_class is EffectClass.IRREVERSIBLE and e.apply is not None
            and self.max_delivery_attempts > 1
        ]
        now = time.time()
        with self._lock:
            statements: list[tuple[str, Any]] = []
            for effect in failed:
                if effect in retry:
                    continue
                why = error_text(errors.get(effect.key))
                if effect.effect_class is EffectClass.BUFFERABLE:
                    why += ("; a buffered write is not retried after its commit (a later "
                            "transaction may have written the resource since)")
                statements += dead_rows(ident, effect.key, 1, why)
            for effect in retry:
                statements.append((
                    "INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?, ?, ?)",
                    (*ident, effect.key, 1, error_text(errors.get(effect.key)),
                     now + self.retry_backoff),
                ))
            if not retry:
                statements += forget_rows(*ident)
            self._write(statements)
            if not retry:
                self._live.pop(ident, None)
                return
            due = time.monotonic() + self.retry_backoff
            for effect in retry:
                heapq.heappush(self._retries, (due, next(self._retry_n), ident, effect))
            if self._retrier is None:
                self._retrier = threading.Thread(
                    target=self._retry_loop, name=f"atomix-log-retry:{self.location}", daemon=True
                )
                self._retrier.start()
            self._retry_wake.notify_all()

    def _retry_loop(self) -> None:
        """This process's retries of failed deliveries, each under its own key, with backoff."""
        while True:
            with self._lock:
                while not self.closed:
                    wait = self._retries[0][0] - time.monotonic() if self._retries else None
                    if wait is not None and wait <= 0:
                        break
                    self._retry_wake.wait(wait)
                if self.closed:
                    return
                _, _, ident, effect = heapq.heappop(self._retries)
            error: Exception | None = None
            try:
                assert effect.apply is not None
                effect.apply()
            except Exception as exc:  # noqa: BLE001 - counted, retried or dead-lettered
                error = exc
            try:
                self._retried(ident, effect, error)
            except Exception as exc:  # noqa: BLE001 - unmarked: the next recovery re-delivers by key
                self.errors.append(exc)

    def _retried(self, ident: Ident, effect: Effect, error: Exception | None) -> None:
        with self._lock:
            if self.closed:
                return
            run_id, txid = ident
            rows = self._query(
                "SELECT attempts FROM deliveries WHERE run_id = ? AND txid = ? AND key = ?",
                (run_id, txid, effect.key),
            )
            attempts = (rows[0][0] if rows else 1) + 1
            statements: list[tuple[str, Any]] = []
            finished = False
            if error is None:
                statements += [
                    ("UPDATE effects SET status = ? WHERE run_id = ? AND txid = ? AND key = ?",
                     (RELEASED, run_id, txid, effect.key)),
                    ("DELETE FROM deliveries WHERE run_id = ? AND txid = ? AND key = ?",
                     (run_id, txid, effect.key)),
                ]
                finished = True
            elif attempts >= self.max_delivery_attempts:
                statements += dead_rows(ident, effect.key, attempts, error_text(error))
                finished = True
            else:
                delay = min(self.retry_backoff * 2 ** (attempts - 1), self.retry_backoff_max)
                statements.append((
                    "UPDATE deliveries SET attempts = ?, last_error = ?, next_at = ? "
                    "WHERE run_id = ? AND txid = ? AND key = ?",
                    (attempts, error_text(error), time.time() + delay, run_id, txid, effect.key),
                ))
                heapq.heappush(
                    self._retries, (time.monotonic() + delay, next(self._retry_n), ident, effect)
                )
            if finished and not any(i == ident for _, _, i, _ in self._retries):
                statements += forget_rows(run_id, txid)
                self._live.pop(ident, None)
            self._write(statements)

    def delivery_failed(self, run_id: str, txid: int, key: str, status: str, error: str) -> bool:
        """Recovery's failed delivery of one effect: count it; True if that was the last
        attempt allowed and it went to the dead letters."""
        with self._lock:
            rows = self._query(
                "SELECT attempts FROM deliveries WHERE run_id = ? AND txid = ? AND key = ?",
                (run_id, txid, key),
            )
            # A commit that got as far as this effect tried it once (status failed).
            attempts = (rows[0][0] if rows else int(status == FAILED)) + 1
            if attempts >= self.max_delivery_attempts:
                self._write(dead_rows((run_id, txid), key, attempts, error))
                return True
            self._write([(
                "INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, txid, key, attempts, error, None),
            )])
            return False

    def _join_retrier(self) -> None:
        """Wait for the retry thread to stop (the host has set `closed` and notified
        `_retry_wake`, under its lock); queued retries stay in ``deliveries`` for the next
        start or `atomix recover`."""
        retrier = self._retrier
        if retrier is not None and retrier is not threading.current_thread():
            retrier.join(5.0)
