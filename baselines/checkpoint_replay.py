"""`checkpoint-replay`: checkpoint the agent's memory; on failure restore it and replay.

Mechanism: calls go straight to the substrates without idempotency keys (as in no-tx). After
each successful step the agent's memory is checkpointed (a deep copy), as graph runtimes with
a checkpointer do. A failed step aborts the attempt, which retracts nothing in the world;
`restore()` returns the last checkpoint (or step 0, empty memory) and the agent replays from
there under the same transaction identity. Commit does nothing.
Known failures: a replayed step re-applies an effect that had landed before the failure (F2):
a duplicate; effects of a run that finally gives up stay applied (residue, not reported);
irreversible sends made before an abort leak; no isolation between agents.
Versus the paper: Table 9 has checkpoint-replay 100% clean at F2-only fp=0.10; here it is
lower (`atomix reproduce --tables 9` shows it),
because re-running the failed step (by the agent's step retry or by the replay) re-applies an
effect that had landed. Table 15 has leaks only for tool-failure and time-out aborts; here any
abort after a send (a veto included) leaves it sent (`atomix run configs/leakage.yaml`).
Where it wins and loses (seed 2026, llm-like agent with max_steps=30; `atomix run
configs/tau_retail.yaml`, `configs/tau_retail_notify.yaml` and `configs/tau_stress.yaml` print
the figures, tau_stress with `--modes checkpoint-replay`, since it does not list this mode):
Wins: with the paper's protocol (3 wrapper retries that replay the failed step below the
agent), which `atomix run configs/tau_retail_paper_protocol.yaml` shows.
Loses: under the fair protocol an LLM sees the error itself and the checkpoint is never used,
so it scores as no-tx on tau_retail and, with notifications, leaks and duplicates mails as
no-tx does (eager sends without keys); on tau_stress it has no isolation and loses updates.
"""

from __future__ import annotations

import copy
from typing import Any

from atomix.effects import AbortSource
from harness.modes.base import AgentContext, ModeSession, ModeSettings, TrialMode
from harness.world.clock import VirtualClock
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolCall


class CheckpointReplayTrial(TrialMode):
    """The checkpointer: one saved (step, memory) per transaction, shared by its attempts.

    A resumed attempt opens a new session with the same trace, so the checkpoint lives here,
    keyed by trace, rather than on the session that wrote it.
    """

    def __init__(self, env: TrialEnv, clock: VirtualClock, settings: ModeSettings) -> None:
        super().__init__(env, clock, settings)
        self.checkpoints: dict[str, tuple[int, dict[str, Any]]] = {}

    def session(self, ctx: AgentContext) -> CheckpointReplaySession:
        return CheckpointReplaySession(self, ctx)


class CheckpointReplaySession(ModeSession):
    """Direct calls; after an abort, resume from the last checkpointed step.

    Guarantees only that the agent's memory is restored exactly as it was after its last
    successful step; the world is not restored.
    """

    resumes_from_checkpoint = True
    trial: CheckpointReplayTrial

    async def call(self, call: ToolCall) -> Any:
        return await self.call_directly(call)

    def checkpoint(self, step: int, memory: dict[str, Any]) -> None:
        # A deep copy: the agent keeps mutating its memory after the checkpoint is taken.
        self.trial.checkpoints[self.ctx.trace] = (step, copy.deepcopy(memory))

    def restore(self) -> tuple[int, dict[str, Any]] | None:
        saved = self.trial.checkpoints.get(self.ctx.trace)
        if saved is None:
            return 0, {}
        step, memory = saved
        return step, copy.deepcopy(memory)

    async def commit(self) -> None:
        self.trial.checkpoints.pop(self.ctx.trace, None)

    async def abort(self, source: AbortSource | str, detail: str = "") -> None:
        # Checkpointing restores the agent, not the world: nothing is undone out there.
        return None
