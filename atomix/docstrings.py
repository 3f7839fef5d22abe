"""Parameter descriptions from docstrings, in Google, NumPy or Sphinx style.

A tool's schema takes its description from the docstring's first paragraph and each
parameter's from its `Args:` (Google), `Parameters` / `----------` (NumPy) or `:param x:`
(Sphinx) entry. Text that is not recognised is left out, never guessed.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable

__all__ = ["parse_docstring"]

_GOOGLE_PARAMS = {
    "args",
    "arguments",
    "parameters",
    "params",
    "keyword args",
    "keyword arguments",
    "kwargs",
    "other parameters",
    "attributes",
}
_GOOGLE_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:(?:\s+(.*))?$")
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(?::.*)?$")
_SPHINX_PARAM = re.compile(
    r"^:(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?\*{0,2}([A-Za-z_]\w*)\s*:\s*(.*)$"
)
_SPHINX_FIELD = re.compile(r"^:\w+[^:]*:")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join(lines: Iterable[str]) -> str:
    return " ".join(s.strip() for s in lines if s.strip())


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and each parameter's description of a docstring in
    Google, NumPy or Sphinx style. Text it does not recognise is left out, never guessed."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    params: dict[str, str] = {}

    def is_header(i: int) -> bool:
        line = lines[i]
        if _GOOGLE_HEADER.match(line.strip()) and _indent(line) == 0:
            return True
        return i + 1 < len(lines) and bool(line.strip()) and bool(_NUMPY_RULE.match(lines[i + 1]))

    summary: list[str] = []
    for i, line in enumerate(lines):
        if not line.strip() or is_header(i) or _SPHINX_FIELD.match(line.strip()):
            break
        summary.append(line)

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        numpy = i + 1 < len(lines) and stripped and _NUMPY_RULE.match(lines[i + 1])
        google = _GOOGLE_HEADER.match(stripped) if not numpy else None
        if numpy and stripped.lower() in _GOOGLE_PARAMS:
            i = _numpy_section(lines, i + 2, _indent(line), params)
            continue
        if google and google.group(1).lower() in _GOOGLE_PARAMS:
            i = _google_section(lines, i + 1, _indent(line), params)
            continue
        sphinx = _SPHINX_PARAM.match(stripped)
        if sphinx:
            text = [sphinx.group(2)]
            base = _indent(line)
            i += 1
            while i < len(lines) and lines[i].strip() and _indent(lines[i]) > base:
                text.append(lines[i])
                i += 1
            params.setdefault(sphinx.group(1), _join(text))
            continue
        i += 1
    return _join(summary), params


def _google_section(lines: list[str], i: int, header: int, out: dict[str, str]) -> int:
    """Parse the entries of an `Args:` section from line i; return the line after it."""
    entry: int | None = None  # the indentation of entries, set by the first one
    name: str | None = None
    text: list[str] = []

    def flush() -> None:
        if name is not None:
            out.setdefault(name, _join(text))

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        indent = _indent(line)
        if indent <= header:
            break
        if entry is None:
            entry = indent
        if indent == entry:
            match = _GOOGLE_ENTRY.match(line.strip())
            if match is None:
                break  # not an entry at the entries' indentation: the section is over
            flush()
            name, text = match.group(1), [match.group(2) or ""]
        elif indent > entry and name is not None:
            text.append(line)
        else:
            break
        i += 1
    flush()
    return i


def _numpy_section(lines: list[str], i: int, header: int, out: dict[str, str]) -> int:
    """Parse the entries of a NumPy `Parameters` section from line i (after its rule)."""
    names: list[str] = []
    text: list[str] = []

    def flush() -> None:
        for n in names:
            out.setdefault(n, _join(text))

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if i + 1 < len(lines) and _NUMPY_RULE.match(lines[i + 1]):
            break  # the next section's header
        indent = _indent(line)
        if indent < header:
            break
        if indent == header:
            match = _NUMPY_ENTRY.match(line.strip())
            if match is None:
                break
            flush()
            names = [n.strip().lstrip("*") for n in match.group(1).split(",")]
            text = []
        elif names:
            text.append(line)
        i += 1
    flush()
    return i
