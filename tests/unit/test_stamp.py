from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuenv.project import stamp


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUENV_REGISTRY_MIRROR", raising=False)
    return tmp_path


def test_fresh_until_an_input_changes(tmp_path: Path) -> None:
    spec, lock = tmp_path / "gpuenv.yaml", tmp_path / "gpuenv.lock"
    spec.write_text("a")
    lock.write_text("b")
    assert stamp.fresh_tag(str(tmp_path), False) is None
    stamp.record(str(tmp_path), False, "gpuenv/x:1", [str(spec), str(lock)])
    assert stamp.fresh_tag(str(tmp_path), False) == "gpuenv/x:1"
    assert stamp.fresh_tag(str(tmp_path), True) is None  # --bake has its own stamp
    lock.write_text("bb")
    assert stamp.fresh_tag(str(tmp_path), False) is None


def test_mirror_and_missing_files_invalidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "gpuenv.yaml"
    spec.write_text("a")
    stamp.record(str(tmp_path), False, "gpuenv/x:1", [str(spec)])
    monkeypatch.setenv("GPUENV_REGISTRY_MIRROR", "127.0.0.1:5000")
    assert stamp.fresh_tag(str(tmp_path), False) is None
    monkeypatch.delenv("GPUENV_REGISTRY_MIRROR")
    os.unlink(spec)
    assert stamp.fresh_tag(str(tmp_path), False) is None


def test_damaged_stamp_is_ignored(tmp_path: Path) -> None:
    spec = tmp_path / "gpuenv.yaml"
    spec.write_text("a")
    stamp.record(str(tmp_path), False, "gpuenv/x:1", [str(spec)])
    (path,) = Path(stamp.stamp_dir()).glob("*.json")
    path.write_text("{not json")
    assert stamp.fresh_tag(str(tmp_path), False) is None


@pytest.mark.parametrize(
    "folders",
    [
        ("/work/a", "/work/a/", "/work/./a"),  # one folder, one stamp
        ("/work/a b",),
        ("/work/a%20b",),  # not the same as the one above
        ("/work/é",),
        ("/" + "long/" * 60,),  # past a file name's length: hashed
        ("/" + "long/" * 60 + "x",),
    ],
)
def test_each_folder_has_a_stamp_of_its_own(folders: tuple[str, ...]) -> None:
    names = {stamp._path(folder, bake) for folder in folders for bake in (False,)}
    assert len(names) == 1
    name = os.path.basename(names.pop())
    assert len(name) <= 255 and "/" not in name
    assert stamp._path(folders[0], True) != stamp._path(folders[0], False)


def test_no_two_folders_share_a_stamp() -> None:
    folders = [
        "/work/a b",
        "/work/a%20b",
        "/work/a+bake",
        "/work/é",
        "/" + "long/" * 60,
        "/" + "long/" * 60 + "x",
        "/work/a",
    ]
    paths = {stamp._path(folder, bake) for folder in folders for bake in (False, True)}
    assert len(paths) == 2 * len(folders)
