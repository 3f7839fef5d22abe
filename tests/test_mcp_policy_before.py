"""The proxy's policy can give a reversible tool a before-image: `before: {tool, args}` is an
upstream call made just before the call runs, and the compensation reads its result as
`{before}` / `{before.FIELD}` (restore what was there, not merely delete what was written)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_mcp_proxy import _call, _policy, _run, _upstream, _upstream_calls, proxied

from atomix.integrations.mcp import PolicyError, load_policy

RESTORE_POLICY: dict[str, Any] = {
    "boundary": "explicit",
    "tools": {
        "read_note": {"effect": "read-only", "reads": "fs:/notes/{name}"},
        "write_note": {
            "effect": "reversible",
            "writes": "fs:/notes/{name}",
            "before": {"tool": "read_note", "args": {"name": "{name}"}},
            "compensate": {"tool": "write_note", "args": {"name": "{name}", "text": "{before.result}"}},
        },
    },
}


def test_abort_restores_the_before_image_read_by_the_policy(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "notes").mkdir(parents=True)
    (work / "notes" / "plan").write_text("the old plan")

    async def scenario() -> dict[str, Any]:
        async with proxied(_policy(tmp_path, RESTORE_POLICY), _upstream(work), tmp_path / "err") as s:
            await _call(s, "write_note", name="plan", text="a new plan")
            assert (work / "notes" / "plan").read_text() == "a new plan"  # reversible: ran now
            aborted = await _call(s, "atomix_abort", reason="keep the old one")
            return aborted.structured_content

    report = _run(scenario())  # before: the policy did not load ("unknown key 'before'")
    assert report["outcome"] == "aborted" and report["clean"], report
    assert (work / "notes" / "plan").read_text() == "the old plan"
    assert _upstream_calls(work, "read_note") == [{"name": "plan"}]  # read before the write
    assert [c["text"] for c in _upstream_calls(work, "write_note")] == ["a new plan", "the old plan"]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            {"effect": "irreversible", "before": {"tool": "read_note"}},
            "tools.w.before: only a reversible tool has a before-image",
        ),
        (
            {"effect": "reversible", "compensate": {"tool": "write_note", "args": {"text": "{before}"}}},
            "reads {before}, but the rule has no `before:`",
        ),
        (
            {"effect": "reversible", "before": {"tool": "read_note", "args": {"name": "{result.name}"}},
             "compensate": {"tool": "delete_note"}},
            "a before-image is read before the call runs",
        ),
        (
            {"effect": "reversible", "before": {"tool": "read_note", "argz": {}}, "compensate": {"tool": "x"}},
            "tools.w.before.argz: unknown key (did you mean 'args'?)",
        ),
    ],
)
def test_a_bad_before_names_the_key(tmp_path: Path, rule: dict[str, Any], expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        load_policy(_policy(tmp_path, {"tools": {"w": rule}}))
    assert expected in str(err.value) and "policy.yaml" in str(err.value), str(err.value)
