"""`no-frontier`: Atomix transactions that commit right at seal, without waiting for frontiers.

Mechanism: the same runtime as tx-full (sealed footprints, effect-class settlement, idempotency
keys, scope-on-read and abort-on-stale at commit), with one switch off: a sealed transaction
does not wait until earlier conflicting transactions have settled.
Known failures: commit order on a resource no longer follows epoch order, so a later plan can
settle before an earlier one it conflicts with; stale decisions caught only when the stale
read check happens to see the other commit first.
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml` and `configs/tau_retail_notify.yaml` print the figures, and
`atomix run configs/tau_stress.yaml --modes tx-full,no-frontier` then `atomix compare
RUN_DIR --baseline tx-full` compares it with tx-full on paired trials):
Wins: the same as tx-full wherever one agent works alone (tau_retail, tau_retail_notify); on
tau_stress, without frontier waits an aborted attempt holds nothing up, so at the lower mixed
fault rate it can edge out tx-full.
Loses: where commit order across agents matters (see Known failures); at the higher mixed
fault rate its interval and tx-full's overlap. Its paper figures (Table 6: 30/3) come from the
protocol asymmetry, not the mechanism (`atomix run configs/tau_retail_paper_protocol.yaml`).
"""

from __future__ import annotations

from atomix.manager import RuntimeOptions
from harness.modes.tx import tx_factory

factory = tx_factory(RuntimeOptions(wait_for_frontiers=False))
