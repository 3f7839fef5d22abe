"""A bounded YAML loader for configs and `--set` values.

PyYAML's SafeLoader refuses code-running tags but not input that is merely hostile: aliases
expand without limit (a ten-line "billion laughs" document becomes billions of nodes for
whoever walks it), an alias may point into its own node (a cyclic structure that recurses
forever), deep nesting exhausts the Python stack, a repeated key silently replaces the
first, and the bytes need not be UTF-8. `load_yaml` refuses each of these with a
`YamlInputError` whose message is one line and names the line where it is known.

What a successful load guarantees: the result is built only of dict, list, str, int, float,
bool and None; no container contains itself; nesting is at most `MAX_DEPTH` deep and the
fully expanded document (every alias counted at its full size) holds at most `MAX_NODES`
nodes; no mapping repeats a key (YAML merge keys `<<` may still be overridden, as YAML
intends). Timestamps, binary, sets and ordered maps are refused or read as plain strings, so
every value can be written as JSON.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import Resolver
from yaml.scanner import Scanner

MAX_BYTES = 256 * 1024  # a config is a few KB; 256 KiB compose in about a second
MAX_DEPTH = 32  # the deepest shipped config is 5 levels
MAX_NODES = 100_000  # after alias expansion; a shipped config has a few hundred


class YamlInputError(ValueError):
    """Input refused before or while parsing; `line` is 1-based when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


def _where(node_or_mark: Any) -> int | None:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    return None if mark is None else mark.line + 1


class _Bounds(Composer):
    """A composer that bounds depth and expanded size and refuses self-references and
    duplicate keys while the node graph is composed, before any Python object is built.

    The compose methods are PyYAML's own (yaml/composer.py) with the bookkeeping added.
    """

    def _start_bounds(self) -> None:
        Composer.__init__(self)
        self._open: set[int] = set()  # ids of collections being composed
        self._size: dict[int, int] = {}  # expanded size of every finished node
        self._depth: dict[int, int] = {}  # expanded depth of every finished node
        self._level = 0  # nesting level of the node being composed

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None and id(target) in self._open:
                raise YamlInputError(
                    f"alias *{event.anchor} is used inside the node it names "
                    "(a self-referencing structure)",
                    _where(event),
                )
            return super().compose_node(parent, index)  # undefined aliases fail here
        self._level += 1
        try:
            if self._level > MAX_DEPTH:
                raise YamlInputError(
                    f"nested more than {MAX_DEPTH} levels deep", _where(self.peek_event())
                )
            return super().compose_node(parent, index)
        finally:
            self._level -= 1

    def _finish(self, node: Node, children: list[Node]) -> None:
        # An alias counts at its target's full size and depth: that is what expanding costs.
        size = 1 + sum(self._size.get(id(c), 1) for c in children)
        depth = 1 + max((self._depth.get(id(c), 1) for c in children), default=0)
        self._size[id(node)], self._depth[id(node)] = size, depth
        self._open.discard(id(node))
        if self._level - 1 + depth > MAX_DEPTH:
            raise YamlInputError(
                f"nested more than {MAX_DEPTH} levels deep once aliases are expanded", _where(node)
            )
        if size > MAX_NODES:
            raise YamlInputError(
                f"more than {MAX_NODES:,} values once aliases are expanded (an alias bomb?)",
                _where(node),
            )

    def compose_sequence_node(self, anchor: str | None) -> SequenceNode:
        start_event = self.get_event()
        tag = start_event.tag
        if tag is None or tag == "!":
            tag = self.resolve(SequenceNode, None, start_event.implicit)
        node = SequenceNode(tag, [], start_event.start_mark, None, flow_style=start_event.flow_style)
        self._open.add(id(node))
        if anchor is not None:
            self.anchors[anchor] = node
        index = 0
        while not self.check_event(yaml.SequenceEndEvent):
            node.value.append(self.compose_node(node, index))
            index += 1
        node.end_mark = self.get_event().end_mark
        self._finish(node, node.value)
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        start_event = self.get_event()
        tag = start_event.tag
        if tag is None or tag == "!":
            tag = self.resolve(MappingNode, None, start_event.implicit)
        node = MappingNode(tag, [], start_event.start_mark, None, flow_style=start_event.flow_style)
        self._open.add(id(node))
        if anchor is not None:
            self.anchors[anchor] = node
        seen: dict[tuple[str, str], int | None] = {}
        while not self.check_event(yaml.MappingEndEvent):
            key = self.compose_node(node, None)
            self._refuse_duplicate(key, seen)
            node.value.append((key, self.compose_node(node, key)))
        node.end_mark = self.get_event().end_mark
        self._finish(node, [n for pair in node.value for n in pair])
        return node

    @staticmethod
    def _refuse_duplicate(key: Node, seen: dict[tuple[str, str], int | None]) -> None:
        if key.tag == "tag:yaml.org,2002:merge" or not isinstance(key, ScalarNode):
            return  # merge keys may be overridden (YAML intends it); others fail when built
        ident = (key.tag, key.value)
        if ident in seen:
            first = seen[ident]
            where = f" (first at line {first})" if first is not None else ""
            raise YamlInputError(
                f"duplicate key {key.value!r}{where}; a key may appear once per mapping",
                _where(key),
            )
        seen[ident] = _where(key)


# libyaml's C parser (when PyYAML has it) makes the events much faster than the Python one
# (`python -m timeit -s "import yaml; t = open('configs/tau_stress.yaml').read()"
# "list(yaml.parse(t, Loader=yaml.CSafeLoader))"`, then with `yaml.SafeLoader`, compares
# them); composing stays in Python, above, so the bounds apply either way.
try:
    from yaml._yaml import CParser as _Parser
except ImportError:  # PyYAML built without libyaml
    _Parser = None


class _BoundedLoader(_Bounds, *((_Parser,) if _Parser else (Reader, Scanner, Parser)), SafeConstructor, Resolver):  # type: ignore[misc]
    """The loader: bounded composition over the fastest available parser, safe construction."""

    def __init__(self, stream: str) -> None:
        if _Parser is not None:
            _Parser.__init__(self, stream)
        else:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._start_bounds()

    # The C parser defines these itself; the bounded ones must win.
    get_single_node = Composer.get_single_node
    compose_document = Composer.compose_document


def _refuse_tag(loader: Any, node: Node) -> Any:
    raise YamlInputError(f"the tag {node.tag} is not allowed in a config", _where(node))


# Only JSON-like values: a timestamp, binary blob, set or ordered map would reach cell ids,
# manifests and records that are written as JSON.
for _tag in ("binary", "timestamp", "set", "omap", "pairs"):
    _BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)
# A bare 2024-01-01 is read as the string it looks like rather than a date.
_BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def decode_utf8(data: bytes) -> str:
    """`data` as text, or YamlInputError naming the line and byte of the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise YamlInputError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
            "cannot be decoded (save the file as UTF-8)",
            line,
        ) from None
    return text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is harmless


def _one_line(exc: yaml.YAMLError, source: str) -> YamlInputError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        said = [exc.context, exc.problem]
        return YamlInputError("not valid YAML: " + ", ".join(s for s in said if s), _where(mark))
    if isinstance(exc, yaml.reader.ReaderError):
        line = source[: exc.position].count("\n") + 1
        return YamlInputError(f"character #x{exc.character:04x} is not allowed in YAML", line)
    return YamlInputError("not valid YAML: " + re.sub(r"\s+", " ", str(exc)).strip())


def load_yaml(source: str | bytes) -> Any:
    """Parse one YAML document within the bounds above; YamlInputError on anything else."""
    if len(source) > MAX_BYTES:
        raise YamlInputError(f"larger than {MAX_BYTES // 1024} KiB ({len(source):,} bytes)")
    text = decode_utf8(source) if isinstance(source, bytes) else source
    loader = None
    try:
        loader = _BoundedLoader(text)
        return loader.get_single_data()
    except YamlInputError:
        raise
    except yaml.YAMLError as exc:
        raise _one_line(exc, text) from None
    except RecursionError:  # a last resort: MAX_DEPTH should make this unreachable
        raise YamlInputError(f"nested too deeply (more than {MAX_DEPTH} levels)") from None
    finally:
        if loader is not None:
            loader.dispose()
