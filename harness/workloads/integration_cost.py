"""Integration cost of each settlement mechanism, and what it composes with (paper Table 14).

A trial runs a probe on the real tau2 retail tools (`harness.workloads.retail.substrate`)
under the trial's mode, with every tool definition audited: each read of a settlement field
(`WIRING_FIELDS`: scopes, effect class, idempotency key, before-image, undo, check) made by a
mode session's code is recorded with the session's class. From that, measured on the source
(`harness.workloads.loc`; lines of code: non-blank, non-comment, non-docstring):

- `integration_loc`: the one-time harness integration, the module of the session class that
  read the tools (harness/modes/tx.py for tx-full, baselines/<mode>.py for a baseline);
- `library_loc`: the `atomix` library code that module builds on (the runtime for tx-full),
  classes it names counted whole;
- `wiring_loc`: the per-tool metadata the mechanism read, over the whole retail tool table:
  the code reachable from the fields it read (the scope functions, the before-image and undo,
  the dry-run check, the key function) plus the effect-class declarations, less the code the
  tool's own `run` reaches anyway (the tool itself, its store, the op log);
  `wiring_loc_per_tool` divides it by the number of tools integrated.

The probe also measures what the mechanism composes with, from ground truth:

- recovery (R): agent a0 cancels an order, then a write is refused; after the abort the
  order's record must be as it was;
- irreversible gating (I): agent a1 queues a customer mail, then vetoes its plan; the sink
  must hold no mail of it;
- stale-plan isolation (S): agent a2 reads an order and later rewrites its address from what
  it read, while agent a3 rewrites the same address in between; both must commit and the
  oracle must find no stale commit.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import random
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.agents.task import AgentOutcome, AgentPolicy, Step, Task
from harness.modes.base import ModeSession
from harness.workloads.base import Scenario, WorkloadParams
from harness.workloads.loc import (
    ROOT,
    code_lines,
    library_lines,
    module_loc,
    module_path,
    reach_lines,
    relative,
)
from harness.workloads.retail.cow import cow_db
from harness.workloads.retail.data import RetailData, load_retail, pending_orders
from harness.workloads.retail.substrate import NOTIFY, RETAIL_TOOLS, RetailStore
from harness.world.oracle import stale_commits
from harness.world.substrates import TrialEnv
from harness.world.tooling import ToolDef

#: The settlement metadata of a tool a mechanism may need (harness.world.tooling.ToolDef). `run`
#: (the tool itself), `name`, `idempotent` (an op-log annotation for the oracle) and
#: `alternatives` (the agent's) are not wiring.
WIRING_FIELDS = ("reads", "writes", "effect", "key", "before", "undo", "check")
MISSING_ORDER = "#W0000000"  # no such order: a write to it is refused by the tool


class IntegrationCostParams(WorkloadParams):
    """`params` of integration_cost: none (the probe and the measures are fixed)."""


class ToolAudit:
    """Which wiring fields of the audited tools each mode session class read.

    Guarantees: a read is recorded only when a `ModeSession` method is on the call stack
    (the agent's own reads of a tool, e.g. to declare a footprint, are not the mechanism's),
    attributed to that session's class.
    """

    def __init__(self) -> None:
        self.fields: dict[type, set[str]] = {}

    def note(self, name: str, frame: types.FrameType | None) -> None:
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, ModeSession):
                self.fields.setdefault(type(owner), set()).add(name)
                return
            frame = frame.f_back

    def wrap(self, tools: Mapping[str, ToolDef]) -> dict[str, ToolDef]:
        """Audited copies of `tools` (same fields, same behaviour)."""
        out: dict[str, ToolDef] = {}
        for name, tool in tools.items():
            copy = _AuditedTool(**{f.name: getattr(tool, f.name) for f in dataclasses.fields(ToolDef)})
            object.__setattr__(copy, "_audit", self)
            out[name] = copy
        return out


class _AuditedTool(ToolDef):
    """A ToolDef whose wiring-field reads are reported to its `ToolAudit`."""

    __slots__ = ("_audit",)

    def __getattribute__(self, name: str) -> Any:
        if name in WIRING_FIELDS:
            try:
                audit = object.__getattribute__(self, "_audit")
            except AttributeError:  # still being built (ToolDef's own checks)
                audit = None
            if audit is not None:
                audit.note(name, sys._getframe(1))
        return object.__getattribute__(self, name)


# --------------------------------------------------------------------------- the measures


def _effect_declarations(tools: Mapping[str, ToolDef]) -> set[tuple[str, int]]:
    """Lines that declare an effect class (`EffectClass.<member>`) in the modules that define
    the tools (where each tool's `run` is written)."""
    out: set[tuple[str, int]] = set()
    for path in sorted({t.run.__code__.co_filename for t in tools.values()}):
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        lines = code_lines(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "EffectClass" and node.lineno in lines:
                out.add((relative(path), node.lineno))
    return out


def wiring_lines(tools: Mapping[str, ToolDef], fields: frozenset[str]) -> set[tuple[str, int]]:
    """The per-tool wiring a mechanism reading `fields` needs over `tools` (module docstring)."""
    roots = [getattr(t, f) for t in tools.values() for f in sorted(fields - {"effect"})]
    lines = reach_lines([r for r in roots if r is not None])
    if "effect" in fields:
        lines |= _effect_declarations(tools)
    return lines - reach_lines([t.run for t in tools.values()])


@functools.lru_cache(maxsize=64)
def measures(module: str, fields: frozenset[str]) -> dict[str, Any]:
    """The integration cost of the mechanism in `module` that read `fields` of the retail tools."""
    wiring = wiring_lines(RETAIL_TOOLS, fields)
    return {
        "integration_loc": module_loc(module),
        "library_loc": len(library_lines(module, ROOT / "atomix")),
        "wiring_loc": len(wiring),
        "wiring_loc_per_tool": len(wiring) / len(RETAIL_TOOLS),
        "tools_integrated": len(RETAIL_TOOLS),
    }


# --------------------------------------------------------------------------- the probe


@functools.lru_cache(maxsize=1)
def _data() -> RetailData:
    return load_retail(None)


def _address(order: dict[str, Any], order_id: str, tag: str) -> dict[str, Any]:
    address = order["address"]
    return {"order_id": order_id, "address1": address["address1"],
            "address2": f"{address['address2']} [{tag}]", "city": address["city"],
            "state": address["state"], "country": address["country"], "zip": address["zip"]}


class IntegrationCostWorkload:
    """The retail tools, audited, under a probe for recovery, gating and isolation."""

    name = "integration_cost"
    probes_mechanism = True  # its verdict does not depend on the agent's task
    description = "lines of code each mechanism needs on the retail tools, and whether it composes with R/I/S"
    Params = IntegrationCostParams

    def __init__(self) -> None:
        self.audit = ToolAudit()
        self.tools: Mapping[str, ToolDef] = self.audit.wrap(RETAIL_TOOLS)

    def scenario(self, rng: random.Random, trial: int, params: Mapping[str, Any]) -> Scenario:
        IntegrationCostParams.model_validate(params)
        data = _data()
        recovered, contended = rng.sample(pending_orders(data.db), 2)
        orders = data.db["orders"]
        email = data.db["users"][orders[recovered]["user_id"]]["email"]
        tasks = [
            Task("recovery", (
                Step("cancel_pending_order", {"order_id": recovered, "reason": "no longer needed"}),
                Step("modify_pending_order_address", _address(orders[contended], MISSING_ORDER, "a0")),
            )),
            Task("gating", (
                Step(NOTIFY.name, {"to": email, "subject": "order cancelled", "body": "refund issued"}),
            ), veto=True),
            Task("stale-plan", (
                Step("get_order_details", {"order_id": contended}, save_as="order"),
                Step("modify_pending_order_address",
                     lambda memory: _address(memory["order"], contended, "a2")),
            )),
            Task("overwrite", (
                Step("modify_pending_order_address", _address(orders[contended], contended, "a3")),
            )),
        ]
        before = dict(orders[recovered])
        audit = self.audit

        def setup(env: TrialEnv) -> None:
            env.extra["retail"] = RetailStore(cow_db(data), env.oplog)

        def metrics(env: TrialEnv, outcomes: list[AgentOutcome]) -> dict[str, Any]:
            readers = sorted(audit.fields, key=lambda c: (c.__module__, c.__qualname__))
            if len(readers) != 1:
                raise RuntimeError(
                    f"integration_cost: expected one mode session class to read the tools, "
                    f"found {[c.__qualname__ for c in readers]}"
                )
            (session,) = readers
            fields = frozenset(audit.fields[session])
            committed = {(o.agent, o.committed_attempt) for o in outcomes if o.committed_attempt is not None}
            by_agent = {o.agent: o for o in outcomes}
            store: RetailStore = env.extra["retail"]
            sent_by_a1 = [m for m in env.messages() if (m.get("meta") or {}).get("agent") == "a1"]
            isolated = (by_agent["a2"].committed and by_agent["a3"].committed
                        and stale_commits(env.oplog.ops(), committed) == 0)
            return {
                **measures(session.__module__, fields),
                "composes_recovery": dict(store.db["orders"][recovered]) == before,
                "composes_gating": not sent_by_a1,
                "composes_isolation": isolated,
            }

        def final(env: TrialEnv) -> dict[str, Any]:
            (session,) = audit.fields
            return {"integration_module": relative(module_path(session.__module__)),
                    "wiring_fields": sorted(audit.fields[session])}

        # a2 reads at 20 ms and writes at about 45 ms; a3 starts at 10 ms and writes at 30 ms.
        policy = AgentPolicy(step_retries=0, max_attempts=3, plan_delay_ms=(20.0, 20.0))
        return Scenario(tasks=tasks, setup=setup, policy=policy, start_offsets_ms=[0.0, 0.0, 0.0, 10.0],
                        metrics=metrics, final=final,
                        info={"recovered_order": recovered, "contended_order": contended})
