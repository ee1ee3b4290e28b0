from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuenv.errors import LockError, SpecError
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    lock_differences,
    lock_from_resolution,
    read_lock,
    render_lock,
    requirements_hashes,
    write_lock,
)
from gpuenv.matrix.load import Matrix
from gpuenv.project.validate import load_spec
from gpuenv.resolution.resolve import resolve

from ..conftest import make_host, reseal

SPEC = 'framework: pytorch\nversion: "2.4"\nrequirements: requirements.txt\n'


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "gpuenv.yaml").write_text(SPEC)
    (tmp_path / "requirements.txt").write_text("numpy==1.26.4\n-r extra/more.txt\n")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "more.txt").write_text("einops\n")
    return tmp_path


def locked(project: Path, matrix: Matrix) -> Path:
    spec = load_spec(str(project))
    resolution = resolve(spec, matrix, make_host("550.54.15", "NVIDIA GeForce RTX 4090"))
    path = project / LOCK_FILENAME
    write_lock(str(path), lock_from_resolution(resolution, matrix.version))
    return path


def test_round_trip(project: Path, matrix: Matrix) -> None:
    path = locked(project, matrix)
    text = path.read_text()
    assert text.startswith(
        "# gpuenv.lock: written by gpuenv; do not edit by hand.\n# Commit this file"
    )
    lock = read_lock(str(path))
    assert lock.image == "nvcr.io/nvidia/pytorch:24.06-py3"  # 545+ (Triton rel-24-06)
    assert lock.digest == "" and lock.pinned_image == lock.image
    assert lock.resolved["framework_version"] == "2.4.0a0+f70bd71a48"  # the full string
    assert lock.requires["min_driver"] == "545"
    assert lock.requires["compute_capabilities"] == ["8.9"]
    assert lock.resolved_for["driver"] == "550.54.15"
    assert set(lock.requirements) == {"requirements.txt", "extra/more.txt"}
    assert lock.matrix_version == matrix.version
    assert render_lock(lock) == text  # stable: the same lock renders byte for byte the same
    keys = [line.split(":")[0] for line in text.splitlines() if line and line[0].isalpha()]
    assert keys == [
        "lock_version",
        "gpuenv_version",
        "spec_hash",
        "requirements",
        "matrix_version",
        "image",
        "resolved",
        "requires",
        "resolved_for",
        "overlay",
        "integrity",
    ]
    assert not lock.overlay.resolved  # written without an engine: the packages come later


def test_a_clone_in_another_folder_finds_its_lock_current(project: Path, matrix: Matrix) -> None:
    """The project's default name is its folder's: `git clone URL my-copy` must not make
    the lock stale."""
    import shutil

    path = locked(project, matrix)
    clone = project.parent / "my-copy"
    shutil.copytree(project, clone)
    assert load_spec(str(clone)).name != load_spec(str(project)).name
    lock = read_lock(str(clone / path.name))
    assert lock_differences(lock, load_spec(str(clone))) == []


def test_up_to_date(project: Path, matrix: Matrix) -> None:
    lock = read_lock(str(locked(project, matrix)))
    assert lock_differences(lock, load_spec(str(project))) == []


def test_comment_edit_is_not_a_change(project: Path, matrix: Matrix) -> None:
    lock = read_lock(str(locked(project, matrix)))
    (project / "gpuenv.yaml").write_text("# tuned\n" + SPEC.replace('"2.4"', "'2.4'   # pinned"))
    assert lock_differences(lock, load_spec(str(project))) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda p: (p / "gpuenv.yaml").write_text(SPEC.replace("2.4", "2.5")),
            "gpuenv.yaml changed since the lock was written",
        ),
        (
            lambda p: (p / "requirements.txt").write_text("numpy==2.0\n-r extra/more.txt\n"),
            "requirements file requirements.txt changed",
        ),
        (
            lambda p: (p / "extra" / "more.txt").write_text("einops==0.8\n"),
            "requirements file extra/more.txt changed",
        ),
        (
            lambda p: (p / "requirements.txt").write_text("numpy\n"),
            "requirements file extra/more.txt is no longer used",
        ),
    ],
)
def test_differences(project: Path, matrix: Matrix, edit, expected: str) -> None:
    lock = read_lock(str(locked(project, matrix)))
    edit(project)
    assert expected in lock_differences(lock, load_spec(str(project)))


def test_new_requirements_file(project: Path, matrix: Matrix) -> None:
    lock = read_lock(str(locked(project, matrix)))
    (project / "dev.txt").write_text("pytest\n")
    (project / "gpuenv.yaml").write_text(
        SPEC.replace("requirements.txt", "[requirements.txt, dev.txt]")
    )
    changes = lock_differences(lock, load_spec(str(project)))
    assert "requirements file dev.txt is new" in changes


def test_includes_outside_the_project_are_a_located_error(project: Path) -> None:
    (project / "requirements.txt").write_text("numpy\n-r ../../etc/passwd\n")
    spec = load_spec(str(project))
    with pytest.raises(SpecError, match=r"requirements.txt:2: includes '../../etc/passwd', "):
        requirements_hashes(spec)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lock_version: [\n", "is damaged (not valid YAML"),
        ("- a\n", "is damaged"),
        ("lock_version: 1\n", "'image' is missing"),
        ("lock_version: 99\ngpuenv_version: 9.0\n", "written by a newer gpuenv (9.0"),
    ],
)
def test_damaged_locks(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / LOCK_FILENAME
    path.write_text(text)
    with pytest.raises(LockError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_lock(str(path))


def test_bad_digest_is_damage(project: Path, matrix: Matrix) -> None:
    path = locked(project, matrix)
    path.write_text(path.read_text().replace("digest: ''", "digest: latest"))
    reseal(path)  # a damaged lock that still carries a matching digest
    with pytest.raises(LockError, match="is not sha256"):
        read_lock(str(path))


def test_missing_lock(tmp_path: Path) -> None:
    with pytest.raises(LockError, match="not found") as info:
        read_lock(str(tmp_path / LOCK_FILENAME))
    assert info.value.exit_code == 5


def test_atomic_write_keeps_old_lock_on_failure(
    project: Path, matrix: Matrix, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = locked(project, matrix)
    before = path.read_text()
    lock = read_lock(str(path))

    def crash(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_lock(str(path), lock)
    assert path.read_text() == before
    assert sorted(p.name for p in project.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize(
    ("edit", "by"),
    [
        (("pytorch:24.06-py3", "pytorch:24.10-py3"), "another image"),
        (("min_driver: '545'", "min_driver: '450'"), "a lower driver floor"),
        (("digest: ''", "digest: sha256:" + "ab" * 32), "a digest"),
    ],
)
def test_a_lock_edited_by_hand_is_refused(
    project: Path, matrix: Matrix, edit: tuple[str, str], by: str
) -> None:
    """Issue 12, item 4: the lock's integrity digest covers what it pins."""
    path = locked(project, matrix)
    text = path.read_text()
    assert edit[0] in text, by
    path.write_text(text.replace(*edit))
    with pytest.raises(LockError, match="edited by hand") as refused:
        read_lock(str(path))
    assert refused.value.exit_code == 5
    assert "gpuenv lock" in (refused.value.hint or "")


def test_a_lock_without_a_digest_still_reads(project: Path, matrix: Matrix) -> None:
    """Locks written before the digest existed are read as they are."""
    path = locked(project, matrix)
    kept = [line for line in path.read_text().splitlines() if not line.startswith("integrity:")]
    path.write_text("\n".join(kept) + "\n")
    assert read_lock(str(path)).image == "nvcr.io/nvidia/pytorch:24.06-py3"


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        # PyTorch 2.5 (24.10) for a spec that asks for 2.4 (issue 12's replayed case).
        ("nvcr.io/nvidia/pytorch:24.10-py3", "has PyTorch 2.5.0a0+e000cf0ad9, not 2.4"),
        # A tag that does not exist anywhere.
        ("nvcr.io/nvidia/pytorch:99.99-py3", "is in no matrix"),
        # 24.06 fits the spec, but not the R535 host the lock says it was resolved for.
        ("DRIVER", "needs driver ≥ 545 (this host has 535.104.05)"),
    ],
)
def test_a_lock_that_pins_what_gpuenv_would_not_is_refused(
    project: Path, matrix: Matrix, image: str, problem: str
) -> None:
    """Issue 12, item 4: even with a matching digest (re-sealed), check, lock --check and
    everything that loads the project refuse a lock whose image does not fit."""
    from click.testing import CliRunner

    from gpuenv.cli.tree import main
    from gpuenv.lock.lockfile import check_locked_row
    from gpuenv.lock.project import load_project

    path = locked(project, matrix)
    text = path.read_text()
    if image == "DRIVER":
        text = text.replace("driver: 550.54.15", "driver: 535.104.05")
    else:
        text = text.replace("nvcr.io/nvidia/pytorch:24.06-py3", image)
    path.write_text(text)
    reseal(path)
    lock = read_lock(str(path))
    with pytest.raises(LockError, match="pins an image that does not fit") as refused:
        check_locked_row(lock, load_spec(str(project)), matrix)
    assert problem in refused.value.message
    with pytest.raises(LockError):
        load_project(str(project))  # build, run, render, push, submit, export
    for command in (["check"], ["lock", "--check"], ["render"]):
        result = CliRunner().invoke(main, ["-C", str(project), *command])
        assert result.exit_code == 5, (command, result.output)


def test_a_lock_a_matrix_correction_invalidated_says_lock_upgrade(
    project: Path, matrix: Matrix, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A lock gpuenv wrote (its digest holds) against a row a later matrix corrects: exit
    5 naming the corrected fact, both matrix versions and `gpuenv lock --upgrade`; then
    `gpuenv lock` resolves again (it no longer says "up to date") and check is green."""
    import shutil

    from click.testing import CliRunner

    from gpuenv.cli.tree import main

    from ..conftest import MATRICES

    locked(project, matrix)
    corrected = tmp_path_factory.mktemp("matrices")
    for name in os.listdir(MATRICES):
        shutil.copy(os.path.join(MATRICES, name), corrected / name)
    rows = corrected / "ngc-pytorch.yaml"
    text = rows.read_text()
    row = text.index('  - tag: "24.06-py3"')
    floor = text.index('min_driver: "545"', row)
    rows.write_text(text[:floor] + 'min_driver: "555"' + text[floor + len('min_driver: "545"') :])
    env = {"GPUENV_MATRIX_DIR": str(corrected)}
    runner = CliRunner()
    for command in (["check"], ["lock", "--check"], ["render"]):
        result = runner.invoke(main, ["-C", str(project), *command], env=env)
        assert result.exit_code == 5, (command, result.output)
        assert "PyTorch 24.06 needs driver ≥ 555 (this host has 550.54.15)" in result.stderr
        assert f"resolved against matrix {matrix.version}" in result.stderr
        assert "run `gpuenv lock --upgrade`" in result.stderr
    fixed = runner.invoke(main, ["-C", str(project), "lock"], env=env)
    assert fixed.exit_code == 0, fixed.output
    assert "the locked image no longer fits" in fixed.stderr
    assert "24.06" not in fixed.stdout
    assert runner.invoke(main, ["-C", str(project), "check"], env=env).exit_code == 0
