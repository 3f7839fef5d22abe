"""Threads keep the runtime's word: a late call from a plain thread-pool task whose
transaction has ended is refused instead of committing on its own, and under contention
every transaction that `Runtime.run` retries commits in the end (no starvation). Each test
failed on the runtime before the behaviour it checks."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from atomix import Runtime
from atomix.errors import OutsideTransaction, TransactionAborted


def test_a_plain_pool_task_that_outlives_its_aborted_transaction_cannot_send() -> None:
    """It used to send: the call had no transaction, no block was open any more, so it
    committed on its own (only strict=True refused it)."""
    rt = Runtime(timeout=5.0)
    sent: list[str] = []

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def send(to: str, text: str) -> None:
        sent.append(text)

    released = threading.Event()

    def late_task() -> None:
        released.wait(5.0)  # runs on after its transaction has ended
        send("ann@example.org", "too late")

    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(RuntimeError), rt.transaction():
            future = pool.submit(late_task)
            raise RuntimeError("the agent gives up")
        released.set()
        with pytest.raises(OutsideTransaction, match="outlived it"):
            future.result(5.0)
    assert sent == []


def test_independent_calls_outside_transactions_still_commit_on_their_own() -> None:
    """What stays allowed: a call from the main thread, from a thread started outside every
    block, and from a worker of rt.executor() (which runs in the submitter's context)."""
    rt = Runtime(timeout=5.0)
    sent: list[str] = []

    @rt.tool(effect="irreversible", writes="mail:{to}")
    def send(to: str, text: str) -> None:
        sent.append(text)

    with rt.transaction(), rt.executor(1) as pool:
        pool.submit(send, "a@example.org", "in the block").result()
    send("a@example.org", "main thread")
    worker = threading.Thread(target=send, args=("a@example.org", "own thread"))
    worker.start()
    worker.join()
    with rt.executor(1) as pool:
        pool.submit(send, "a@example.org", "executor, outside").result()
    assert sent == ["in the block", "main thread", "own thread", "executor, outside"]


def test_contention_with_retries_starves_no_transaction() -> None:
    """Many threads read-modify-write the same two scopes through rt.run: each retry after a
    stale read used to be the newest transaction on them, the one an earlier writer makes
    stale again, and some ran out of retries. A retry now claims what it lost."""
    rt = Runtime(timeout=30.0, keep_settlements=False)
    store = {"c": 0, "d": 0}
    failures: list[str] = []
    threads, per_thread = 8, 60

    @rt.tool(reads="kv:{k}")
    def get(k: str) -> int:
        return store[k]

    @rt.tool(effect="bufferable", writes="kv:{k}")
    def put(k: str, v: int) -> None:
        store[k] = v

    def body(tx: Any) -> None:
        c = get("c")
        time.sleep(random.random() / 2000)  # widen the window an earlier writer can use
        d = get("d")
        put("c", c + 1)
        put("d", d + 1)

    def worker() -> None:
        for _ in range(per_thread):
            try:
                rt.run(body, retries=3)
            except TransactionAborted as exc:
                failures.append(exc.source)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert failures == []
    assert store == {"c": threads * per_thread, "d": threads * per_thread}
