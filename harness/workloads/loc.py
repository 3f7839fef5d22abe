"""Lines of code, measured from the source itself (for paper Table 14's integration cost).

A line of code is a physical source line holding a token that is not a comment and not part
of a docstring (a string that opens a module, class or function body); blank lines do not
count. Counts are taken over the project's own packages (`atomix`, `harness`, `baselines`).

`Reach` collects the lines of the project code reachable from some functions: each reached
function's own lines, then the project functions it names (globals, closure variables) and,
for the attribute names it uses, the methods or stored functions of the objects it can see
(its closure's project objects, the class of a method, the class a reached function is
annotated to return). With `whole_classes`, a project class it names counts as a whole (the
classes a module builds on); otherwise classes only resolve attribute names.
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import sys
import tokenize
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tuple(ROOT / p for p in ("atomix", "harness", "baselines"))
_NOT_CODE = frozenset({
    tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
    tokenize.ENCODING, tokenize.ENDMARKER,
})

Line = tuple[str, int]  # (path relative to the repository, line number)


@functools.lru_cache(maxsize=256)
def _source(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=256)
def code_lines(path: str) -> frozenset[int]:
    """The line numbers of `path` that hold code (see the module docstring)."""
    text = _source(path)
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in _NOT_CODE:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.difference_update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return frozenset(lines)


def module_loc(module: str) -> int:
    """Lines of code of an imported module's file."""
    return len(code_lines(str(module_path(module))))


def module_path(module: str) -> Path:
    mod = sys.modules.get(module)
    if mod is None or getattr(mod, "__file__", None) is None:
        raise ValueError(f"{module!r} is not an imported module with a source file")
    return Path(mod.__file__).resolve()  # type: ignore[arg-type]


def relative(path: str | Path) -> str:
    """`path` relative to the repository (absolute when outside it)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(resolved)


def in_project(path: str | Path) -> bool:
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(p) for p in PROJECT)


@dataclass(frozen=True)
class _Index:
    """Spans (first, last line) of a file's definitions: by qualified name, and lambdas by
    their first line."""

    spans: dict[str, tuple[int, int]]
    lambdas: dict[int, list[tuple[int, int]]]


@functools.lru_cache(maxsize=256)
def _index(path: str) -> _Index:
    spans: dict[str, tuple[int, int]] = {}
    lambdas: dict[int, list[tuple[int, int]]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                spans.setdefault(name, (first, child.end_lineno or child.lineno))
                inner = f"{name}.<locals>." if not isinstance(child, ast.ClassDef) else f"{name}."
                visit(child, inner)
            else:
                if isinstance(child, ast.Lambda):
                    lambdas.setdefault(child.lineno, []).append((child.lineno, child.end_lineno or child.lineno))
                visit(child, prefix)

    visit(ast.parse(_source(path)), "")
    return _Index(spans, lambdas)


def _span_lines(path: str, first: int, last: int) -> set[Line]:
    rel = relative(path)
    return {(rel, n) for n in code_lines(path) if first <= n <= last}


def function_lines(fn: types.FunctionType) -> set[Line]:
    """The code lines of one function (a lambda: the lambdas on its first line)."""
    code = fn.__code__
    path = code.co_filename
    index = _index(path)
    if code.co_name == "<lambda>":
        spans = index.lambdas.get(code.co_firstlineno, [(code.co_firstlineno, code.co_firstlineno)])
        return set().union(*(_span_lines(path, a, b) for a, b in spans))
    span = index.spans.get(code.co_qualname)
    if span is None:  # a redefinition or a generated function: its own line range
        last = max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)
        span = (code.co_firstlineno, last)
    return _span_lines(path, *span)


def class_lines(cls: type) -> set[Line]:
    path = inspect.getsourcefile(cls)
    assert path is not None
    span = _index(path).spans.get(cls.__qualname__)
    return _span_lines(path, *span) if span is not None else set()


def _function(obj: Any) -> types.FunctionType | None:
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
    if isinstance(obj, staticmethod | classmethod):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    if isinstance(obj, functools.partial):
        obj = obj.func
    if isinstance(obj, types.FunctionType) and in_project(obj.__code__.co_filename):
        return obj
    return None


def _project_class(obj: Any) -> type | None:
    if isinstance(obj, type):
        try:
            path = inspect.getsourcefile(obj)
        except TypeError:
            return None
        return obj if path is not None and in_project(path) else None
    return None


@dataclass
class Reach:
    """The project code lines reachable from what is `add`ed (see the module docstring);
    only lines of files under `count_in` count, but names are followed from anywhere in the
    project. Deterministic: the same objects give the same lines."""

    count_in: tuple[Path, ...] = PROJECT
    whole_classes: bool = False
    follow_in: tuple[Path, ...] = PROJECT  # names are followed only from code under these
    lines: set[Line] = field(default_factory=set)
    _seen: set[tuple[int, int]] = field(default_factory=set)
    _keep: list[Any] = field(default_factory=list)  # keeps ids in _seen unique

    def _counts(self, path: str) -> bool:
        resolved = Path(path).resolve()
        return any(resolved.is_relative_to(p) for p in self.count_in)

    def _follows(self, path: str) -> bool:
        resolved = Path(path).resolve()
        return any(resolved.is_relative_to(p) for p in (*self.follow_in, *self.count_in))

    def add(self, obj: Any, receiver: Any = None) -> None:
        """Reach `obj` (a function, method or class; anything else is ignored)."""
        stack: list[tuple[Any, Any]] = [(obj, receiver)]
        while stack:
            item, recv = stack.pop()
            cls = _project_class(item)
            if cls is not None:
                if self.whole_classes:
                    stack.extend(self._whole(cls))
                continue
            fn = _function(item)
            if fn is None:
                continue
            if isinstance(item, types.MethodType):
                recv = item.__self__
            key = (id(fn), id(recv))
            if key in self._seen:
                continue
            self._seen.add(key)
            self._keep.append((fn, recv))
            if self._counts(fn.__code__.co_filename):
                self.lines |= function_lines(fn)
            if self._follows(fn.__code__.co_filename):
                stack.extend(self._references(fn, recv))

    def _whole(self, cls: type) -> list[tuple[Any, Any]]:
        key = (id(cls), 0)
        if key in self._seen:
            return []
        self._seen.add(key)
        path = inspect.getsourcefile(cls)
        if path is not None and self._counts(path):
            self.lines |= class_lines(cls)
        if path is None or not self._follows(path):
            return []
        found: list[tuple[Any, Any]] = [(base, None) for base in cls.__bases__]
        for value in vars(cls).values():
            if _function(value) is not None:
                found.append((value, None))
        return found

    def _references(self, fn: types.FunctionType, recv: Any) -> list[tuple[Any, Any]]:
        names, attributes = _names(fn)
        named = [fn.__globals__[n] for n in names if n in fn.__globals__]
        if fn.__closure__:
            for cell in fn.__closure__:
                try:
                    named.append(cell.cell_contents)
                except ValueError:  # an empty cell (a name bound later)
                    continue
        out: list[tuple[Any, Any]] = [(v, None) for v in named if _function(v) or _project_class(v)]
        receivers: list[Any] = [] if recv is None else [recv]
        owner = fn.__qualname__.split(".")[0]
        if "<locals>" not in fn.__qualname__ and "." in fn.__qualname__:
            receivers.append(fn.__globals__.get(owner))
        for value in named:
            if _project_class(value) is not None or _project_class(type(value)) is not None:
                receivers.append(value)
                if self.whole_classes and _project_class(type(value)) is not None:
                    out.append((type(value), None))
            target = _function(value)
            if target is not None:
                receivers.extend(_returned_classes(target))
        for name in attributes:
            for target in receivers:
                found = _attribute(target, name)
                if found is not None:
                    out.append((found, target if not isinstance(target, type) else None))
        return out


def _names(fn: types.FunctionType) -> tuple[list[str], list[str]]:
    """(global names, attribute names) a function's code uses, nested code (comprehensions,
    inner functions) included; a name that is not a global or builtin is an attribute."""
    found: list[str] = []
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        found.extend(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    unique = sorted(set(found))
    builtins = vars(__builtins__) if isinstance(__builtins__, types.ModuleType) else __builtins__
    names = [n for n in unique if n in fn.__globals__]
    attributes = [n for n in unique if n not in fn.__globals__ and n not in builtins]
    return names, attributes


def _returned_classes(fn: types.FunctionType) -> list[type]:
    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:  # noqa: BLE001 - an unresolvable annotation names nothing here
        return []
    candidates = [hint, *typing.get_args(hint)]
    return [c for c in candidates if _project_class(c) is not None]


def _attribute(target: Any, name: str) -> Any:
    """`target.name` if it is project code, read without running a property."""
    if target is None:
        return None
    try:
        raw = inspect.getattr_static(target, name)
    except AttributeError:
        return None
    if type(raw).__name__ == "member_descriptor" and not isinstance(target, type):
        raw = getattr(target, name, None)
    if _function(raw) is None:
        return None
    if isinstance(raw, types.FunctionType) and not isinstance(target, type) and name in type(target).__dict__:
        return getattr(target, name)  # a method of the instance: bound to it
    return raw


def library_lines(module: str, library: Path) -> set[Line]:
    """The code under `library` that an imported `module` builds on: reached from every
    function, class and project object in its namespace, classes counted whole, names
    followed only from the module itself and from the library."""
    objects = [v for v in vars(sys.modules[module]).values()
               if _function(v) is not None or _project_class(v) is not None
               or _project_class(type(v)) is not None]
    return reach_lines(objects, count_in=(library,), whole_classes=True,
                       follow_in=(module_path(module),))


def reach_lines(objects: Iterable[Any], *, count_in: tuple[Path, ...] = PROJECT,
                whole_classes: bool = False, follow_in: tuple[Path, ...] = PROJECT) -> set[Line]:
    """The lines `Reach` collects from `objects`."""
    reach = Reach(count_in=count_in, whole_classes=whole_classes, follow_in=follow_in)
    for obj in objects:
        reach.add(obj)
    return reach.lines
