"""`tx-fine-no-overlap`: tx-full with fine, canonical scopes that are not overlap-aware
(paper Table 20's "Fine-NoOverlapAware" scope strategy).

Every scope is canonicalised exactly as tx-full does it (paths resolved, table names and
mail addresses folded, URLs normalised), then flattened to one opaque name, so two scopes
conflict only when they name the very same node: a directory no longer covers its files, a
table its rows, a database its tables, a URL path its extensions. That is a per-resource
lock table keyed by canonical name, as a system without a scope hierarchy would build it.

The runtime's ScopePolicy has no such option, and atomix/ is not changed for an ablation:
the strategy is a ScopePolicy subclass here, handed to the unmodified runtime through
`RuntimeOptions.scopes`, so it transforms every scope (reads, writes, externalised
effects) at the one place the core resolves them.
"""

from __future__ import annotations

import dataclasses

from atomix.manager import RuntimeOptions
from atomix.scope_kinds import naive_scope
from atomix.scope_parsing import ScopePolicy, parse_scope
from atomix.scopes import Scope
from harness.modes.tx import tx_factory


@dataclasses.dataclass(frozen=True, slots=True)
class FlatCanonicalPolicy(ScopePolicy):
    """Canonical spelling without hierarchy.

    Guarantees: aliases of one resource resolve to one Scope (as under the canonical
    policy), and two resolved scopes overlap iff their canonical texts are equal: no scope
    covers another. Resolving a resolved scope again gives it back unchanged.
    """

    def resolve(self, spec: str | Scope) -> Scope:
        if isinstance(spec, Scope) and spec.kind == "raw":
            return spec  # already flat (the core may resolve a resolved scope again)
        return naive_scope(str(parse_scope(spec, casefold=self.casefold)))


FLAT_CANONICAL = FlatCanonicalPolicy()

fine_no_overlap = tx_factory(dataclasses.replace(RuntimeOptions(), scopes=FLAT_CANONICAL))
