"""`no-frontier`: Atomix transactions that commit right at seal, without waiting for frontiers.

Mechanism: the same runtime as tx-full (sealed footprints, effect-class settlement, idempotency
keys, scope-on-read and abort-on-stale at commit), with one switch off: a sealed transaction
does not wait until earlier conflicting transactions have settled.
Known failures: commit order on a resource no longer follows epoch order, so a later plan can
settle before an earlier one it conflicts with; stale decisions caught only when the stale
read check happens to see the other commit first.
"""

from __future__ import annotations

from atomix.manager import RuntimeOptions
from harness.modes import register
from harness.tx_mode import tx_factory

register(
    "no-frontier",
    "Atomix transactions that commit at seal without waiting for per-resource frontiers",
    tx_factory(RuntimeOptions(wait_for_frontiers=False)),
    family="baseline",
    module=__name__,
)
