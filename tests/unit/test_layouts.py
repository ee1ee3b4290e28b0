"""Every common dependency layout is read, or named as not read (issue 22, item 2): what
`gpuenv init` says for each, as a new user would try it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main

H100 = ["--driver", "550.54.15", "--gpu", "H100"]
POETRY = """[tool.poetry]
name = "x"
[tool.poetry.dependencies]
python = "^3.10"
torch = "2.3.1"
[[tool.poetry.source]]
name = "internal"
url = "https://pypi.internal.example/simple"
priority = "supplemental"
[[tool.poetry.source]]
name = "torch-cu121"
url = "https://download.pytorch.org/whl/cu121"
priority = "explicit"
"""
GROUPS = """[project]
name = "x"
dependencies = ["numpy"]
[project.optional-dependencies]
gpu = ["torch==2.3.1"]
[dependency-groups]
dev = ["pytest"]
"""

CASES = [
    (
        "a requirements/ folder: its base.txt is read, the others named",
        {"requirements/base.txt": "torch==2.3.1\n", "requirements/dev.txt": "pytest\n"},
        ["found requirements/base.txt:1: torch==2.3.1", "not installed: requirements/dev.txt"],
    ),
    (
        # a Pipfile that pins the framework is refused (test_verdicts.py); unpinned, named
        "Pipfile and Pipfile.lock: named as not read, with the export command",
        {"Pipfile": '[packages]\ntorch = "*"\n', "Pipfile.lock": "{}\n"},
        [
            "Pipfile and Pipfile.lock: not read",
            "pipenv requirements > requirements.txt",
            "no framework found in any file gpuenv reads",
        ],
    ),
    (
        "optional groups and PEP 735 groups: named, with the extras: that installs one",
        {"pyproject.toml": GROUPS},
        ["optional groups not installed: dev, gpu (torch)", "extras: [gpu]"],
    ),
    (
        "Poetry: its python constraint is used, its sources reported as pip's are",
        {"pyproject.toml": POETRY},
        [
            "[tool.poetry.dependencies] python = '^3.10'",
            "Poetry source internal (https://pypi.internal.example/simple): not passed",
            "Poetry source torch-cu121 (https://download.pytorch.org/whl/cu121) serves "
            "framework builds for another CUDA: not used",
        ],
    ),
    (
        "uv's .python-version form is read",
        {".python-version": "cpython-3.10.14-linux-x86_64-gnu\n", "requirements.txt": "torch\n"},
        ["found .python-version: python cpython-3.10.14-linux-x86_64-gnu"],
    ),
    (
        "another interpreter's .python-version is named as not used",
        {".python-version": "pypy3.10\n", "requirements.txt": "torch\n"},
        [".python-version: 'pypy3.10' is not a CPython version gpuenv can match"],
    ),
]


@pytest.mark.parametrize(("what", "files", "said"), CASES, ids=[c[0] for c in CASES])
def test_each_layout_is_read_or_named(
    tmp_path: Path, what: str, files: dict[str, str], said: list[str]
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "init", *H100])
    output = " ".join(result.output.split())
    for text in said:
        assert text in output, f"{what}: {output}"


def test_the_poetry_python_constraint_reaches_the_spec(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(POETRY)
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "init", *H100])
    assert result.exit_code == 0, result.output
    assert 'python: ">=3.10,<4.0.0"' in (tmp_path / "gpuenv.yaml").read_text()
