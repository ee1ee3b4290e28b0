"""Load YAML keeping where every value came from, so messages can name file and line.

PyYAML's composed node tree carries positions; the constructed data does not. We keep the
nodes beside the data and find a path (``("mounts", 0, "target")``) in them only when a
message asks for its line, so a file without problems costs one parse and no walk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import yaml

from gpuenv.common import nesting
from gpuenv.errors import Problem

Path = tuple[str | int, ...]

_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


@dataclass(frozen=True)
class Position:
    line: int
    column: int


@dataclass(frozen=True)
class _Index:
    """Every path's position, found by walking the whole node tree."""

    positions: dict[Path, Position]
    duplicates: tuple[Problem, ...]
    number_text: dict[Path, str]


@dataclass(frozen=True)
class YamlDocument:
    """Parsed data, its duplicate keys, and the node tree positions are looked up in."""

    filename: str
    data: Any
    duplicates: tuple[Problem, ...] = ()
    node: Any = field(default=None, repr=False, compare=False)
    # Documents with aliases or duplicate keys are walked once, eagerly: a node reached on
    # several paths is located under the first, which a look-up by path cannot know.
    index: _Index | None = field(default=None, repr=False, compare=False)

    def position(self, path: Path) -> Position | None:
        """The position of `path`, or of its nearest located parent."""
        if self.index is not None:
            while path:
                if path in self.index.positions:
                    return self.index.positions[path]
                path = path[:-1]
            return self.index.positions.get(())
        if self.node is None:
            return None
        node, position = self.node, _pos(self.node)
        for part in path:
            found = _child(node, part)
            if found is None:
                break
            located, node = found
            position = _pos(located)
        return position

    def number_text(self, path: Path) -> str | None:
        """The source text of a plain scalar YAML read as a number.

        `python: 3.10` means "3.10", not the float 3.1: version fields use this text.
        """
        if self.index is not None:
            return self.index.number_text.get(path)
        node = self.node
        for part in path:
            found = _child(node, part)
            if found is None:
                return None
            node = found[1]
        return _number_text(node)

    def problem(self, path: Path, message: str) -> Problem:
        """A problem located at `path`, its field named the dotted path."""
        pos = self.position(path)
        dotted = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path)
        dotted = dotted.replace(".[", "[")
        return Problem(
            self.filename,
            pos.line if pos else None,
            pos.column if pos else None,
            dotted or None,
            message,
        )


class YamlSyntaxError(Exception):
    """The text is not YAML gpuenv can read; `problem` says where."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def _pos(node: Any) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


def _number_text(node: Any) -> str | None:
    if isinstance(node, yaml.ScalarNode) and not node.style and node.tag in _NUMBER_TAGS:
        return str(node.value)
    return None


def _child(node: Any, part: str | int) -> tuple[Any, Any] | None:
    """(the node that locates `part`, its value node) in a mapping or sequence node:
    the first of duplicate keys, as the walk records them."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == part:
                return key_node, value_node
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
        items = node.value
        return (items[part], items[part]) if 0 <= part < len(items) else None
    return None


def _walk(
    node: Any,
    path: Path,
    positions: dict[Path, Position],
    duplicates: list[Problem],
    filename: str,
    seen: set[int],
    number_text: dict[Path, str],
) -> None:
    # Aliases share nodes: visiting each node once keeps "billion laughs" documents linear.
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        text = _number_text(node)
        if text is not None:
            number_text[path] = text
    elif isinstance(node, yaml.MappingNode):
        first_seen: dict[str, Position] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            child = (*path, key)
            if key in first_seen:
                where = first_seen[key]
                dotted = ".".join(str(p) for p in child)
                duplicates.append(
                    Problem(
                        filename,
                        _pos(key_node).line,
                        _pos(key_node).column,
                        dotted,
                        f"duplicate key '{key}' (first given on line {where.line})",
                    )
                )
                continue
            first_seen[key] = _pos(key_node)
            positions[child] = _pos(key_node)
            _walk(value_node, child, positions, duplicates, filename, seen, number_text)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = (*path, index)
            positions[child] = _pos(item)
            _walk(item, child, positions, duplicates, filename, seen, number_text)


def _index(node: Any, filename: str) -> _Index:
    positions: dict[Path, Position] = {(): _pos(node)}
    duplicates: list[Problem] = []
    number_text: dict[Path, str] = {}
    try:
        _walk(node, (), positions, duplicates, filename, set(), number_text)
    except RecursionError:
        raise YamlSyntaxError(
            Problem(filename, None, None, None, f"invalid YAML: {nesting.TooDeep()}")
        ) from None
    return _Index(positions, tuple(duplicates), number_text)


@cache
def _loader() -> Any:
    """PyYAML's safe loader (libyaml's parser when PyYAML has it: every wheel does,
    several times faster) that notes whether any mapping repeats a key."""
    base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc]
        repeated_key = False

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            mapping = super().construct_mapping(node, deep=deep)
            keys = [key.value for key, _ in node.value if isinstance(key, yaml.ScalarNode)]
            if len(set(keys)) != len(keys):
                self.repeated_key = True
            return mapping

    return Loader


def parse_yaml(text: str, filename: str) -> YamlDocument:
    """Parse one YAML document; raise YamlSyntaxError with the parser's line and column."""
    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        data = nesting.check(loader.construct_document(node)) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = " ".join(part for part in (exc.context, exc.problem) if part)
        raise YamlSyntaxError(
            Problem(
                filename,
                mark.line + 1 if mark else None,
                mark.column + 1 if mark else None,
                None,
                f"invalid YAML: {message or exc}",
            )
        ) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(Problem(filename, None, None, None, f"invalid YAML: {exc}")) from None
    except (RecursionError, nesting.TooDeep):
        raise YamlSyntaxError(
            Problem(filename, None, None, None, f"invalid YAML: {nesting.TooDeep()}")
        ) from None
    finally:
        loader.dispose()
    if node is None:
        return YamlDocument(filename, data)
    # Without an anchor and an alias no node is shared; without a repeated key every path
    # has one node: looking a path up then finds what the walk would have recorded.
    if loader.repeated_key or ("&" in text and "*" in text):
        index = _index(node, filename)
        return YamlDocument(filename, data, index.duplicates, node, index)
    return YamlDocument(filename, data, (), node)


def parse_json(text: str, filename: str) -> YamlDocument:
    """Parse one JSON document: its values as `json` reads them, located through YAML's
    node tree (JSON is YAML's flow style; a tab, in JSON only ever whitespace, becomes a
    space, column for column). Invalid JSON raises YamlSyntaxError with its line."""
    try:
        data = nesting.loads(json.loads, text)
    except json.JSONDecodeError as exc:
        raise YamlSyntaxError(
            Problem(filename, exc.lineno, exc.colno, None, f"invalid JSON: {exc.msg}")
        ) from None
    except nesting.TooDeep as exc:
        raise YamlSyntaxError(Problem(filename, None, None, None, f"invalid JSON: {exc}")) from None
    try:
        located = parse_yaml(text.replace("\t", " "), filename)
    except YamlSyntaxError:  # JSON that YAML 1.1 does not take: problems name fields only
        return YamlDocument(filename, data)
    return replace(located, data=data)


def read_yaml(path: str, display_name: str | None = None) -> YamlDocument:
    """Read and parse a YAML file; undecodable bytes are a located problem, not a crash."""
    name = display_name or path
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlSyntaxError(
            Problem(name, None, None, None, f"not UTF-8 text (byte {exc.start})")
        ) from None
    return parse_yaml(text, name)
