"""The shape STYLE.md asks for: a pure core, one Docker adapter, a thin CLI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gpuenv"
# Modules allowed to import the presentation or Docker libraries.
EDGE = {"cli.py", "ui.py", "matrix_view.py", "live.py", "docker_engine.py"}
FORBIDDEN = {"click", "rich", "docker"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    "path", sorted(p for p in PACKAGE.glob("*.py") if p.name not in EDGE), ids=lambda p: p.name
)
def test_core_is_pure(path: Path) -> None:
    assert not imported_modules(path) & FORBIDDEN


@pytest.mark.parametrize(
    "path",
    sorted(p for p in PACKAGE.glob("*.py") if p.name != "docker_engine.py"),
    ids=lambda p: p.name,
)
def test_only_the_adapter_imports_docker(path: Path) -> None:
    assert "docker" not in imported_modules(path)


def test_version_starts_without_heavy_imports() -> None:
    code = (
        "import sys\n"
        "from gpuenv.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('rich', 'docker', 'yaml', 'packaging', 'pynvml') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert "gpuenv, version" in result.stdout
    assert "HEAVY=\n" in result.stdout
