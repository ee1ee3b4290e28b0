"""A bound on how deeply parsed data may nest, for every file gpuenv reads.

Python's JSON and TOML parsers recurse once per level and end in RecursionError past
about a thousand; a YAML file can nest deeper than the code that walks it afterwards
can follow. No file gpuenv reads needs more than a handful of levels, so every parse
goes through `loads`, which turns both cases into `TooDeep`, a ValueError that each
reader reports as its own file's error, with its own exit code.

>>> import json
>>> loads(json.loads, '{"a": [1, {"b": 2}]}')
{'a': [1, {'b': 2}]}
>>> loads(json.loads, "[" * 5000 + "]" * 5000)
Traceback (most recent call last):
...
gpuenv.common.nesting.TooDeep: nested more than 64 levels deep
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", str, bytes)
R = TypeVar("R")

MAX_DEPTH = 64


class TooDeep(ValueError):
    """Data nested more than MAX_DEPTH levels deep."""

    def __init__(self) -> None:
        super().__init__(f"nested more than {MAX_DEPTH} levels deep")


def _children(value: Any) -> list[Any]:
    items = value.values() if isinstance(value, dict) else value
    return [item for item in items if isinstance(item, (dict, list, tuple))]


def check(data: R) -> R:
    """`data` itself, or TooDeep when lists and mappings in it nest past MAX_DEPTH.

    The longest path counts, whether the data is a tree or (YAML anchors and aliases)
    shares nodes; each shared node is measured once, and a node that contains itself
    is too deep.

    >>> check({"a": [[[]]]})
    {'a': [[[]]]}
    >>> loop: list[Any] = []
    >>> loop.append(loop)
    >>> check(loop)
    Traceback (most recent call last):
    ...
    gpuenv.common.nesting.TooDeep: nested more than 64 levels deep
    """
    if not isinstance(data, (dict, list, tuple)):
        return data
    height: dict[int, int] = {}  # levels below a measured node, by id
    stack: list[tuple[Any, list[Any]]] = [(data, _children(data))]
    while stack:
        node, pending = stack[-1]
        if not pending:
            stack.pop()
            below = [height[id(child)] + 1 for child in _children(node)]
            height[id(node)] = max(below, default=0)
            continue
        child = pending.pop()
        known = height.get(id(child))
        if known is not None:
            if len(stack) + known >= MAX_DEPTH:
                raise TooDeep
            continue
        if len(stack) >= MAX_DEPTH:
            raise TooDeep
        stack.append((child, _children(child)))
    return data


def loads(parse: Callable[[T], R], text: T) -> R:
    """`parse(text)`, bounded: TooDeep where it recurses too far or its data nests too deeply."""
    try:
        data = parse(text)
    except RecursionError:
        raise TooDeep from None
    return check(data)
