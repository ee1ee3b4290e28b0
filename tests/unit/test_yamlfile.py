"""Positions are looked up only when a message needs one; they must be exactly what a
walk of the whole node tree records (the located messages of spec and matrix are pinned
by their tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuenv.common.yamlfile import Position, YamlDocument, YamlSyntaxError, _index, parse_yaml

from ..conftest import MATRICES, REPO


def probes(index_paths: set[tuple[str | int, ...]]) -> set[tuple[str | int, ...]]:
    """Every recorded path, and paths beside them that may not be there: under each
    one, every key of the document (an alias's keys are not recorded under it)."""
    out = set(index_paths)
    keys = {path[-1] for path in index_paths if path and isinstance(path[-1], str)}
    for path in index_paths:
        out |= {(*path, "missing"), (*path, 0), (*path, 99), (*path, -1), (*path, "0")}
        out |= {(*path, key) for key in keys}
        if path and isinstance(path[-1], int):
            out.add((*path[:-1], str(path[-1])))
    return out


def assert_agrees_with_walk(text: str) -> YamlDocument:
    try:
        doc = parse_yaml(text, "f.yaml")
    except YamlSyntaxError:
        return YamlDocument("f.yaml", None)
    if doc.node is None:
        return doc
    walked = _index(doc.node, "f.yaml")
    assert doc.duplicates == walked.duplicates
    for path in probes(set(walked.positions)):
        expected: Position | None = None
        probe = path
        while True:
            if probe in walked.positions:
                expected = walked.positions[probe]
                break
            if not probe:
                break
            probe = probe[:-1]
        assert doc.position(path) == expected, path
        assert doc.number_text(path) == walked.number_text.get(path), path
    return doc


def shipped_files() -> list[Path]:
    return [
        *sorted(Path(MATRICES).glob("*.yaml")),
        *sorted(Path(REPO, "examples").rglob("gpuenv.yaml")),
    ]


@pytest.mark.parametrize("path", shipped_files(), ids=lambda p: p.name)
def test_shipped_files_are_looked_up_without_a_walk(path: Path) -> None:
    doc = assert_agrees_with_walk(path.read_text())
    assert doc.index is None  # no alias, no repeated key: nothing was walked


@pytest.mark.parametrize(
    ("text", "walked"),
    [
        ("framework: pytorch\npython: 3.10\n", False),
        ("a: {b: [1, 2.50, '3.0', x]}\n", False),
        ("- [a, [b, [c, 0x1F]]]\n- {k: 1e3}\n", False),
        ("note: R&D\nstar: a*b\n", True),  # both characters: walked, to be sure
        ("a: &x {k: 1}\nb: *x\n", True),  # b.k: the walk records a only, under b
        ("a: &x {k: 1}\nb: *x\nc: {<<: *x, k: 2}\n", True),
        ("a: 1\nb: 2\na: 3\n", True),
        ("m: {k: 1, k: 2}\n", True),
        ('a: {"1": x, 1: y}\n', True),  # the same key text, different data keys
        ("a: {1: x, 0x1: y}\n", False),  # different key text, one data key
        ("b: {<<: {k: 1}, k: 2}\n", True),  # a merged key given again
        ("just a scalar\n", False),
        ("3.10\n", False),
    ],
)
def test_documents_agree_with_the_walk(text: str, walked: bool) -> None:
    doc = assert_agrees_with_walk(text)
    if doc.node is not None:
        assert (doc.index is not None) is walked


@pytest.mark.parametrize(
    ("text", "path", "line", "column", "number"),
    [
        ("framework: pytorch\npython: 3.10\n", ("python",), 2, 1, "3.10"),
        ("python: '3.10'\n", ("python",), 1, 1, None),
        ("a:\n  - x\n  - {b: 7}\n", ("a", 1, "b"), 3, 6, "7"),
        ("a:\n  - x\n  - {b: 7}\n", ("a", 1, "nothing"), 3, 5, None),
        ("a:\n  - x\n", ("a", 5), 1, 1, None),
        ("a: 1\nb: 2\na: 3\n", ("a",), 1, 1, "1"),  # the first of repeated keys
    ],
)
def test_positions_and_number_text(
    text: str, path: tuple[str | int, ...], line: int, column: int, number: str | None
) -> None:
    doc = parse_yaml(text, "f.yaml")
    assert doc.position(path) == Position(line, column)
    assert doc.number_text(path) == number


def test_duplicates_are_reported_with_both_lines() -> None:
    doc = parse_yaml("framework: pytorch\nframework: jax\n", "gpuenv.yaml")
    assert [str(p) for p in doc.duplicates] == [
        "gpuenv.yaml:2:1: field 'framework': duplicate key 'framework' (first given on line 1)"
    ]


def test_a_document_without_nodes_has_no_positions() -> None:
    doc = YamlDocument("--gpus", None)
    assert doc.position(("gpus",)) is None and doc.number_text(("gpus",)) is None
    assert doc.problem(("gpus",), "bad").line is None


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(yaml_values, st.booleans())
def test_generated_documents_agree_with_the_walk(value: object, flow: bool) -> None:
    assert_agrees_with_walk(yaml.safe_dump(value, default_flow_style=flow))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="{}[]:,-&*<!|>'\"# \n\tabk12.?", max_size=80))
def test_punctuation_agrees_with_the_walk(text: str) -> None:
    assert_agrees_with_walk(text)
