"""Where a trial's final state differs from its goal, path by path.

The oracle says whether the goal was reached (`judge`: the final snapshot equals the expected
one); this says where it was not, so a reader can see why a trial that committed still missed
its goal. Pure and deterministic: the same two states give the same list, in path order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAX_DIFFS", "diff_states"]

#: At most this many differences are listed (a trial that rewrote a whole table is cut short,
#: and says how many more there were).
MAX_DIFFS = 40

_ABSENT = "<absent>"


def _walk(path: str, gold: Any, final: Any, out: list[dict[str, Any]]) -> None:
    if gold == final:
        return
    if isinstance(gold, Mapping) and isinstance(final, Mapping):
        for key in sorted(set(gold) | set(final), key=str):
            _walk(f"{path}.{key}" if path else str(key), gold.get(key, _ABSENT),
                  final.get(key, _ABSENT), out)
        return
    if (isinstance(gold, Sequence) and isinstance(final, Sequence)
            and not isinstance(gold, str | bytes) and not isinstance(final, str | bytes)
            and len(gold) == len(final)):
        for i, (g, f) in enumerate(zip(gold, final, strict=True)):
            _walk(f"{path}[{i}]", g, f, out)
        return
    out.append({"path": path, "gold": gold, "final": final})


def diff_states(gold: Any, final: Any, limit: int = MAX_DIFFS) -> list[dict[str, Any]]:
    """Each leaf where `final` differs from `gold`: `{"path", "gold", "final"}` (a missing key
    reads "<absent>"), at most `limit` of them; when there were more, a last entry
    `{"path": "...", "more": N}` says how many were left out. [] when the two are equal."""
    out: list[dict[str, Any]] = []
    _walk("", gold, final, out)
    if len(out) > limit:
        more = len(out) - limit
        out = [*out[:limit], {"path": "...", "more": more}]
    return out
