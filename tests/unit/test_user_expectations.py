"""What users expect from their tools (issue 31, item 5), tried as they try it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main

A100 = ["--driver", "550.54.15", "--gpu", "A100"]


@pytest.fixture
def inside(tmp_path: Path) -> Iterator[Path]:
    """A project with its spec, and the current folder two levels below it."""
    (tmp_path / "gpuenv.yaml").write_text("name: p\nframework: pytorch\n")
    sub = tmp_path / "src" / "models"
    sub.mkdir(parents=True)
    before = os.getcwd()
    os.chdir(sub)
    try:
        yield tmp_path
    finally:
        os.chdir(before)


def test_gpuenv_yaml_is_found_in_a_parent_folder(inside: Path) -> None:
    result = CliRunner().invoke(main, ["lock", *A100])
    assert result.exit_code == 0, result.output
    assert (inside / "gpuenv.lock").exists()
    assert not (inside / "src" / "models" / "gpuenv.lock").exists()


def test_init_writes_where_it_is_started_never_above(inside: Path) -> None:
    (inside / "src" / "models" / "requirements.txt").write_text("torch==2.3.1\n")
    result = CliRunner().invoke(main, ["init", *A100])
    assert result.exit_code == 0, result.output
    assert (inside / "src" / "models" / "gpuenv.yaml").exists()


def test_directory_given_is_taken_as_it_is(inside: Path) -> None:
    result = CliRunner().invoke(main, ["-C", ".", "check"])
    assert result.exit_code == 3  # -C names the folder: no gpuenv.yaml there
    assert "gpuenv.yaml: not found" in result.stderr


@pytest.mark.parametrize(
    ("before", "git"),
    [(None, True), ("*.pyc\n", False), ("*.pyc", True), (".gpuenv.lock.lock\n.gpuenv/\n", True)],
)
def test_init_adds_gpuenvs_own_files_to_gitignore(
    tmp_path: Path, before: str | None, git: bool
) -> None:
    if git:
        (tmp_path / ".git").mkdir()
    if before is not None:
        (tmp_path / ".gitignore").write_text(before)
    (tmp_path / "requirements.txt").write_text("torch==2.3.1\n")
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "init", *A100])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / ".gitignore").read_text().splitlines()
    assert lines.count(".gpuenv.lock.lock") == 1 and lines.count(".gpuenv/") == 1
    assert "gpuenv.lock" not in lines and "gpuenv.yaml" not in lines
    if before:
        assert lines[0] == before.splitlines()[0]  # what was there stays first


def test_init_outside_git_writes_no_gitignore(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "requirements.txt").write_text("torch==2.3.1\n")
    assert CliRunner().invoke(main, ["-C", str(project), "init", *A100]).exit_code == 0
    assert not any((parent / ".git").exists() for parent in project.parents)  # the premise
    assert not (project / ".gitignore").exists()


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [
        ("gpuenv matrix py", 2, {"pytorch"}),
        ("gpuenv matrix ", 2, {"pytorch", "tensorflow", "jax", "none", "cuda", "gpus", "sync"}),
        ("gpuenv resolve --gpu A10", 3, {"A100", "A10", "A10G"}),
        ("gpuenv init --gpu h1", 3, {"H100"}),  # any case
    ],
)
def test_completion_names_matrix_subjects_and_gpu_models(
    words: str, cword: int, expected: set[str]
) -> None:
    import subprocess
    import sys

    env = {
        **os.environ,
        "_GPUENV_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(cword),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    result = subprocess.run(
        [sys.executable, "-c", "from gpuenv.cli.tree import main; main(prog_name='gpuenv')"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    offered = {line.split(",", 1)[1] for line in result.stdout.splitlines() if "," in line}
    assert expected <= offered, result.stdout + result.stderr
