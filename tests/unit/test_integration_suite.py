"""The integration suite's own rules (issue 33, item 12): every module carries the
`integration` marker (so `-m "not integration"` and the CI split mean what they say), and
no test orders processes with a fixed sleep: a `time.sleep` is either inside a polling
loop (`while` or `for`, with its deadline) or says, in a `# time passes:` comment, that
the test measures time itself (an idle GPU, a run's duration)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[1] / "integration"
MODULES = sorted(SUITE.glob("test_*.py"))


def _marked(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "integration" in ast.unparse(node.value)
    return False


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.name)
def test_every_integration_module_carries_the_marker(module: Path) -> None:
    assert _marked(ast.parse(module.read_text())), f"{module.name}: no pytestmark integration"


def _fixed_sleeps(source: str) -> list[int]:
    tree = ast.parse(source)
    lines = source.splitlines()
    in_loop: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.While | ast.For):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Call):
                    in_loop.add(id(inner))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "time.sleep"
            and id(node) not in in_loop
            and "# time passes:" not in lines[node.lineno - 1]
        ):
            found.append(node.lineno)
    return found


@pytest.mark.parametrize("module", [*MODULES, SUITE / "conftest.py"], ids=lambda p: p.name)
def test_no_integration_test_orders_processes_with_a_fixed_sleep(module: Path) -> None:
    assert _fixed_sleeps(module.read_text()) == [], module.name


def test_the_check_sees_a_fixed_sleep() -> None:
    assert _fixed_sleeps("import time\ntime.sleep(1)\n") == [2]
    assert _fixed_sleeps("import time\nwhile x():\n    time.sleep(1)\n") == []
    assert _fixed_sleeps("import time\ntime.sleep(1)  # time passes: idle\n") == []
