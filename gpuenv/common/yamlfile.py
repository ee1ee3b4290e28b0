"""Load YAML keeping where every value came from, so messages can name file and line.

PyYAML's composed node tree carries positions; the constructed data does not. We compose
once, construct the data from the nodes, and walk the nodes to map each path
(``("mounts", 0, "target")``) to its line and column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuenv.errors import Problem

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    line: int
    column: int


@dataclass(frozen=True)
class YamlDocument:
    """Parsed data plus the position of every mapping key and sequence item."""

    filename: str
    data: Any
    positions: dict[Path, Position] = field(default_factory=dict)
    duplicates: tuple[Problem, ...] = ()
    # The source text of plain scalars YAML read as numbers: `python: 3.10` means "3.10",
    # not the float 3.1, and version fields use this text instead of the number.
    number_text: dict[Path, str] = field(default_factory=dict)

    def position(self, path: Path) -> Position | None:
        """The position of `path`, or of its nearest located parent."""
        while path:
            if path in self.positions:
                return self.positions[path]
            path = path[:-1]
        return self.positions.get(())

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


_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


def _pos(node: Any) -> Position:
    return Position(node.start_mark.line + 1, node.start_mark.column + 1)


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
    import yaml

    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        if not node.style and node.tag in _NUMBER_TAGS:
            number_text[path] = node.value
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


def parse_yaml(text: str, filename: str) -> YamlDocument:
    """Parse one YAML document; raise YamlSyntaxError with the parser's line and column."""
    import yaml  # here, not at import: `gpuenv run` and `--version` never parse YAML

    # libyaml's parser when PyYAML has it (every wheel does): several times faster.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
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
    except RecursionError:
        raise YamlSyntaxError(
            Problem(filename, None, None, None, "invalid YAML: nested too deeply")
        ) from None
    finally:
        loader.dispose()
    positions: dict[Path, Position] = {}
    duplicates: list[Problem] = []
    number_text: dict[Path, str] = {}
    if node is not None:
        positions[()] = _pos(node)
        try:
            _walk(node, (), positions, duplicates, filename, set(), number_text)
        except RecursionError:
            raise YamlSyntaxError(
                Problem(filename, None, None, None, "invalid YAML: nested too deeply")
            ) from None
    return YamlDocument(filename, data, positions, tuple(duplicates), number_text)


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
