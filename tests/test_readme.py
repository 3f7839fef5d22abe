"""The README's example and set-up commands stay true."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_readme_examples_run() -> None:
    """Every python block is self-contained and runs as written."""
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 3, "the README lost its examples"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102


def test_the_readme_has_exactly_two_setup_commands() -> None:
    setup = README.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", setup, re.S)
    assert len(commands) == 2
    assert "atomix run configs/tau_retail.yaml" in commands[0]
    assert "pytest" in commands[1] and "'.[test]'" in commands[1]
