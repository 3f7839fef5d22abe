"""`atomix run --retry-failed RUN`: run a run's errored trials again, in place, with provenance.

A trial is *errored* when its record says the harness, not the mechanism under test, failed
it (`trial_error`): an agent whose model server refused the conversation or gave no answer
in time (an LLM agent's `llm.stop` is `model_error` or `timeout`), or a record that carries
an `error` entry. A goal missed, a leak or a residue is an outcome, never an error, and is
not retried.

What a retry guarantees:

* the run's lock is held throughout, so nothing else writes the run meanwhile;
* each errored trial is run again from the very spec the run planned for it (same config,
  mode, cell, trial and seed), so a deterministic trial gives the same record, apart from
  `timings`, and only a failure outside the trial (a model server) can change the outcome;
* the new record *replaces* the errored one at its line of trials.jsonl (one record per key,
  so every table, comparison and listing counts the trial once) and says it is a retry:
  `retry = {"attempt": 2, "replaces": 1, "at": <UTC time>, "error": <the error it replaced>}`;
* the replaced record is kept, whole, in `trials.retried.jsonl` (the audit trail), and the
  manifest's `retries` lists each retry session (when, how many, how many still errored);
* trials.jsonl is rewritten atomically after all retried trials have finished: an interrupt
  before that leaves the run exactly as it was.

For LLM runs: the completion cache keeps a request that timed out, so that a rerun does not
wait again on a busy server; a retry asks such requests again (the server may answer now),
while a refusal (HTTP 400, e.g. a conversation longer than the context) is replayed.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atomix.adapters.oplog import truncate_torn_tail
from harness.agents.llm_client import ASK_AGAIN_ENV
from harness.errors import RunError
from harness.experiment.config import config_hash, validate_config
from harness.experiment.executors import DEFAULT_EXECUTOR, ExecutorOptions, open_executor
from harness.experiment.interrupts import SignalGuard
from harness.experiment.rundir import (
    MANIFEST,
    TRIALS,
    RunLock,
    foreign_message,
    io_error,
    read_manifest,
    scan_records,
    write_manifest,
)
from harness.experiment.runner import in_run_order, plan
from harness.experiment.trial import run_trial

RETRIED = "trials.retried.jsonl"
#: How an LLM agent's conversation ended when the model server, not the agent, ended it.
MODEL_FAILURES = ("model_error", "timeout")


def trial_error(record: Mapping[str, Any]) -> str | None:
    """Why a record is an errored trial (one line), or None when it is an outcome."""
    error = record.get("error")
    if error:
        if isinstance(error, Mapping):
            return f"{error.get('type', 'error')}: {error.get('message', '')}".strip()
        return str(error)
    for agent in record.get("agents") or []:
        llm = agent.get("llm") if isinstance(agent, Mapping) else None
        if isinstance(llm, Mapping) and llm.get("stop") in MODEL_FAILURES:
            failed = llm.get("failed_requests") or []
            last = failed[-1].get("error") if failed and isinstance(failed[-1], Mapping) else None
            what = "no answer in time" if llm["stop"] == "timeout" else "refused"
            return f"agent {agent.get('agent', '?')}: model {what}" + (f" ({last})" if last else "")
    return None


def attempt_of(record: Mapping[str, Any]) -> int:
    """Which attempt at its trial a record is: 1 for the first run, 2 for the first retry."""
    retry = record.get("retry")
    return int(retry.get("attempt", 1)) if isinstance(retry, Mapping) else 1


@dataclass
class RetryResult:
    """What a retry did: the trials it ran again, how many of them still errored."""

    run_dir: Path
    retried: list[str]
    still_errored: list[str]


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def errored_keys(run_dir: Path) -> dict[str, str]:
    """key -> error of every errored trial of a run (read-only, no lock)."""
    return {
        r["key"]: err
        for r in scan_records(Path(run_dir) / TRIALS).records
        if (err := trial_error(r)) is not None
    }


def retry_failed(
    run_dir: Path,
    *,
    jobs: int = 1,
    executor: str = DEFAULT_EXECUTOR,
    scheduler: str | None = None,
    progress: Callable[[int, int, dict[str, Any] | None], None] | None = None,
) -> RetryResult:
    """Run the errored trials of `run_dir` again (see the module docstring). RunError for a
    directory that is not a run, a run in use, or records of another config."""
    run_dir = Path(run_dir)
    if not (run_dir / MANIFEST).is_file():
        raise RunError(f"{run_dir}: not a run directory (no {MANIFEST})")
    with SignalGuard() as guard:
        lock = RunLock(run_dir).acquire()
        try:
            manifest = read_manifest(run_dir)
            config = validate_config(manifest["config"], run_dir / MANIFEST)
            config = in_run_order(config, run_dir)
            digest = config_hash(config)
            name = config.name or "experiment"
            planned = {s.key: s for s in plan(config)}
            path = run_dir / TRIALS
            scan = scan_records(path, name, manifest.get("config_hash") or digest, set(planned))
            if scan.foreign:
                raise RunError(foreign_message(path, scan.foreign, name, digest))
            errored = {r["key"]: r for r in scan.records if trial_error(r) is not None}
            if not errored:
                return RetryResult(run_dir, [], [])
            specs = [planned[k] for k in planned if k in errored]  # plan order: deterministic
            fresh: dict[str, dict[str, Any]] = {}
            # Set before the executor starts, so its worker processes inherit it too.
            asked_again = os.environ.get(ASK_AGAIN_ENV)
            os.environ[ASK_AGAIN_ENV] = "1"
            engine = open_executor(
                executor, ExecutorOptions(jobs=jobs, scheduler=scheduler, trial=run_trial)
            )
            try:
                if progress:
                    progress(0, len(specs), None)
                with closing(_iterate(engine.results(specs))) as results:
                    for record in results:
                        fresh[record["key"]] = record
                        if progress:
                            progress(len(fresh), len(specs), record)
            finally:
                engine.close()
                if asked_again is None:
                    os.environ.pop(ASK_AGAIN_ENV, None)
                else:
                    os.environ[ASK_AGAIN_ENV] = asked_again
            stamp = _now()
            for key, record in fresh.items():
                old = errored[key]
                record["config_hash"] = str(manifest.get("config_hash") or digest)
                record["retry"] = {
                    "attempt": attempt_of(old) + 1,
                    "replaces": attempt_of(old),
                    "at": stamp,
                    "error": trial_error(old) or "",
                }
            with guard.critical():
                if scan.torn_tail:
                    truncate_torn_tail(path)
                _keep_replaced(run_dir, [errored[k] for k in fresh], stamp)
                _replace_records(path, fresh)
                still = sorted(k for k, r in fresh.items() if trial_error(r) is not None)
                manifest.setdefault("retries", []).append(
                    {"at": stamp, "trials": len(fresh), "still_errored": len(still)}
                )
                write_manifest(run_dir, manifest)
            return RetryResult(run_dir, sorted(fresh), still)
        except OSError as exc:
            raise io_error(run_dir, exc) from None
        finally:
            lock.release()


def _iterate(results: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    # A generator, so that `closing` stops the executor's work on an interrupt.
    yield from results


def _keep_replaced(run_dir: Path, old: list[Mapping[str, Any]], stamp: str) -> None:
    """Append the records being replaced to the audit trail, synced before the swap."""
    with open(run_dir / RETRIED, "a", encoding="utf-8") as fh:
        for record in old:
            entry = {"replaced_at": stamp, "attempt": attempt_of(record), "record": record}
            fh.write(json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _replace_records(path: Path, fresh: Mapping[str, dict[str, Any]]) -> None:
    """Rewrite trials.jsonl with each key of `fresh` on its old line, atomically; every
    other line (damaged ones included) stays byte for byte."""
    out: list[bytes] = []
    for line in path.read_bytes().split(b"\n")[:-1]:
        try:
            key = json.loads(line).get("key")
        except (ValueError, AttributeError):
            key = None
        if isinstance(key, str) and key in fresh:
            line = json.dumps(fresh[key], sort_keys=True, separators=(",", ":")).encode()
        out.append(line + b"\n")
    tmp = path.with_name(f"{TRIALS}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"".join(out))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
