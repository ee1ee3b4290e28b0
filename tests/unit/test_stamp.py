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
    (path,) = Path(stamp.cache_dir()).glob("*.json")
    path.write_text("{not json")
    assert stamp.fresh_tag(str(tmp_path), False) is None
