"""Everything a project declares is installed as its own tools would: PEP 735
include-group, Poetry's groups (the non-optional ones by default, as `poetry install`),
and `-e .` / `.` (the project's own dependencies)."""

from __future__ import annotations

from pathlib import Path

from gpuenv.project.dependencies import read_sources


def names(folder: Path, *sources: str, extras: tuple[str, ...] = ()) -> set[str]:
    collected = read_sources(str(folder), sources, extras=extras)
    assert not collected.problems, collected.problems
    return {d.name for d in collected.dependencies}


def test_an_included_dependency_group_is_installed(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'x'\nversion = '1'\ndependencies = ['numpy']\n"
        "[dependency-groups]\nlint = ['ruff']\n"
        "dev = ['pytest', {include-group = 'lint'}]\n"
        "loop = [{include-group = 'loop'}, 'tqdm']\n"
    )
    assert names(tmp_path, "pyproject.toml", extras=("dev",)) == {"numpy", "pytest", "ruff"}
    assert names(tmp_path, "pyproject.toml", extras=("loop",)) == {"numpy", "tqdm"}


def test_a_group_a_selected_group_includes_is_not_said_to_be_left_out(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'x'\nversion = '1'\n"
        "[dependency-groups]\ndev = ['pytest']\nlint = ['ruff', {include-group = 'dev'}]\n"
        "train = ['tqdm']\ndocs = ['mkdocs']\n"
    )
    collected = read_sources(str(tmp_path), ("pyproject.toml",), extras=("train", "lint"))
    assert {d.name for d in collected.dependencies} == {"tqdm", "ruff", "pytest"}
    (flag,) = [f for f in collected.flags if "optional groups not installed" in f.message]
    assert "docs" in flag.message and "dev" not in flag.message


def test_poetry_extras_left_out_are_named(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.poetry]\nname = 'x'\nversion = '1'\n"
        "[tool.poetry.dependencies]\npython = '^3.10'\nnumpy = '^2.0'\n"
        "wandb = {version = '*', optional = true}\n"
        "[tool.poetry.extras]\ntrack = ['wandb']\n"
    )
    collected = read_sources(str(tmp_path), ("pyproject.toml",))
    assert {d.name for d in collected.dependencies} == {"numpy"}
    (flag,) = [f for f in collected.flags if "Poetry extras not installed" in f.message]
    assert "track" in flag.message and "extras: [track]" in flag.message
    assert names(tmp_path, "pyproject.toml", extras=("track",)) == {"numpy", "wandb"}
    chosen = read_sources(str(tmp_path), ("pyproject.toml",), extras=("track",))
    assert not [f for f in chosen.flags if "Poetry extras" in f.message]


def test_poetry_installs_its_non_optional_groups_and_names_the_others(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.poetry]\nname = 'x'\nversion = '1'\n"
        "[tool.poetry.dependencies]\npython = '^3.10'\nnumpy = '^2.0'\n"
        "[tool.poetry.group.test.dependencies]\npytest = '^8'\n"
        "[tool.poetry.group.docs]\noptional = true\n"
        "[tool.poetry.group.docs.dependencies]\nmkdocs = '*'\n"
    )
    collected = read_sources(str(tmp_path), ("pyproject.toml",))
    assert {d.name for d in collected.dependencies} == {"numpy", "pytest"}
    (flag,) = [f for f in collected.flags if "optional Poetry groups" in f.message]
    assert "docs" in flag.message and "extras: [docs]" in flag.message
    assert names(tmp_path, "pyproject.toml", extras=("docs",)) == {"numpy", "pytest", "mkdocs"}


def test_the_project_itself_brings_its_dependencies(tmp_path: Path) -> None:
    """`-e .` (and `.`) read the project's pyproject.toml: its dependencies are installed,
    and its folder (src/ in the src layout) is on the path in runs."""
    from gpuenv.project.dependencies import plan_install

    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'mypkg'\nversion = '0.1'\ndependencies = ['tqdm>=4', 'einops']\n"
    )
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "requirements.txt").write_text("-e .\nrich\n")
    collected = read_sources(str(tmp_path), ("requirements.txt",))
    assert {d.name for d in collected.dependencies} == {"rich", "tqdm", "einops"}
    assert "pyproject.toml" in collected.files  # hashed into the lock: an edit is a change
    plan = plan_install(collected, "pytorch", None)
    assert plan.paths == ("/workspace/src",)
    assert any("/workspace/src is on the path in runs" in note for note in plan.notes())
    # A path that is no project of this folder is named, not installed.
    (tmp_path / "requirements.txt").write_text("./nothing-here\n")
    collected = read_sources(str(tmp_path), ("requirements.txt",))
    assert not collected.dependencies and "gpuenv does not install" in str(collected.flags[0])
