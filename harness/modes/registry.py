"""The one table of modes: every settlement mechanism the harness can run, by name.

A row names the mode's trial-mode factory lazily (`"module:attr"`), says what the mechanism
does in one line, and its family: `atomix` (tx-full), `ablation` (tx-full with one component
removed), `negative-control` (tx-full with a deliberately broken frontier) or `baseline`.
Adding a mechanism is one module (a `TrialMode` and its sessions, see `harness.modes.base`)
and one row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.modes.base import ModeSettings, RetryBudget, TrialModeFactory, declared_budget
from harness.registry import Entry, Registry, UnknownName


def _mode(name: str, target: str, description: str, family: str) -> Entry[TrialModeFactory]:
    return Entry(name, target, description, {"family": family})


_ABLATION = "ablation of tx-full: "

MODES: Registry[TrialModeFactory] = Registry("mode", [
    _mode("tx-full", "harness.modes.tx:full",
          "Atomix: sealed footprints, per-resource frontiers, effect-class settlement", "atomix"),
    _mode("tx-global-frontier", "harness.modes.tx:global_frontier",
          _ABLATION + "one global frontier instead of one per resource", "ablation"),
    _mode("tx-no-scope-on-read", "harness.modes.tx:no_scope_on_read",
          _ABLATION + "reads are not registered in the footprint", "ablation"),
    _mode("tx-no-abort-on-stale", "harness.modes.tx:no_abort_on_stale",
          _ABLATION + "stale reads and late accesses still commit", "ablation"),
    _mode("tx-naive-string-scopes", "harness.modes.tx:naive_string_scopes",
          _ABLATION + "scopes compared as raw strings, no canonicalisation", "ablation"),
    _mode("tx-no-residue-classification", "harness.modes.tx:no_residue_classification",
          _ABLATION + "failed compensations not reported as residue", "ablation"),
    _mode("tx-no-gate", "harness.modes.tx:no_gate",
          _ABLATION + "irreversible effects are not held at the gate: they run when called "
          "(as eager calls), so an aborted attempt's mail or payment has left", "ablation"),
    _mode("tx-unkeyed", "harness.modes.tx:unkeyed",
          _ABLATION + "effects reach substrates without idempotency keys, so a re-delivery "
          "after an ambiguous failure or a duplicated delivery lands again", "ablation"),
    _mode("tx-no-compensation", "harness.modes.tx:no_compensation",
          _ABLATION + "an abort does not compensate externalised reversible effects: they stay "
          "applied (reported as residue)", "ablation"),
    _mode("tx-no-read-checks", "harness.modes.tx:no_read_checks",
          _ABLATION + "scope-on-read and abort-on-stale removed together: reads are neither "
          "registered nor re-validated", "ablation"),
    _mode("tx-no-seal", "harness.modes.tx:no_seal",
          _ABLATION + "no seal: an access after seal is admitted instead of aborting "
          "(seal_violation)", "ablation"),
    _mode("tx-fine-no-overlap", "harness.modes.tx_flat_scopes:fine_no_overlap",
          _ABLATION + "canonical per-resource scopes compared by equality, no overlap "
          "(a directory, table or URL prefix does not cover what lies below it)", "ablation"),
    _mode("tx-frontier-premature", "harness.modes.tx_frontier_fault:premature",
          "negative control: tx-full whose frontiers advance before earlier epochs finalize",
          "negative-control"),
    _mode("tx-frontier-stalled", "harness.modes.tx_frontier_fault:stalled",
          "negative control: tx-full whose frontiers never advance", "negative-control"),
    _mode("no-tx", "baselines.no_tx:NoTxTrial",
          "direct tool calls; the agent retries a failed step", "baseline"),
    _mode("retry-only", "baselines.retry_only:RetryOnlyTrial",
          "direct tool calls with bounded retries and exponential backoff", "baseline"),
    _mode("saga", "baselines.saga:SagaTrial",
          "execute eagerly; on abort run compensation handlers in reverse; no gating, no isolation",
          "baseline"),
    _mode("tcc", "baselines.tcc:TccTrial",
          "try (reserve) / confirm / cancel per call; confirm at commit; no per-resource ordering",
          "baseline"),
    _mode("checkpoint-replay", "baselines.checkpoint_replay:CheckpointReplayTrial",
          "checkpoint agent memory; on failure restore it and replay; effects are not retracted",
          "baseline"),
    _mode("no-frontier", "harness.modes.tx_no_frontier:factory",
          "Atomix transactions that commit at seal without waiting for per-resource frontiers",
          "baseline"),
    _mode("mutex-wal", "baselines.mutex_wal:MutexWalTrial",
          "workflow mutex + write-ahead log of before-images; rollback on abort; gated irreversibles",
          "baseline"),
    _mode("workflow-lock", "baselines.workflow_lock:WorkflowLockTrial",
          "lock every resource the workflow may touch (its declared footprint) for its whole duration",
          "baseline"),
    _mode("per-call-lock", "baselines.per_call_lock:PerCallLockTrial",
          "lock only the scopes of each single tool call, around that call", "baseline"),
    _mode("occ", "baselines.occ:OccTrial",
          "execute eagerly, record read versions, re-validate at commit, roll back and retry on a "
          "stale read; effects are not gated", "baseline"),
])


@dataclass(frozen=True, slots=True)
class ModeInfo:
    """One mode, loaded: its name, what it does, its factory, where it lives, its family."""

    name: str
    description: str
    factory: TrialModeFactory
    module: str
    family: str

    def budget(self, settings: ModeSettings) -> RetryBudget:
        """The deliveries of one effect this mode makes below the agent under `settings`."""
        return declared_budget(self.factory, settings)


def get_mode(name: str) -> ModeInfo:
    """The mode `name`, its factory imported; UnknownName (a KeyError) names what is allowed."""
    entry = MODES.entry(name)
    return ModeInfo(name, entry.description, MODES[name], entry.module, str(entry.meta["family"]))


def modes() -> dict[str, ModeInfo]:
    """Every mode, in table order, each factory imported."""
    return {name: get_mode(name) for name in MODES}


__all__ = ["MODES", "ModeInfo", "UnknownName", "get_mode", "modes"]
