"""Every setting that points gpuenv at a registry, an index or a path is read with the
mounts' ownership rule (issue 33, item 8): the registry mirror in the user config and
the matrix overlay (whose rows name the images gpuenv pulls) are refused when another
user may write them, and never read through a link or from a FIFO."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuenv.errors import MatrixError
from gpuenv.images.registry import InvalidMirror, registry_mirror
from gpuenv.matrix.files import read_source

CONFIG = "registry_mirror: 127.0.0.1:5000\n"
OVERLAY = "images: []\n"


def writable_by_others(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o666)


def group_writable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o664)


def a_link(path: Path, text: str) -> None:
    target = path.with_name("elsewhere")
    target.write_text(text)
    path.symlink_to(target)


def a_fifo(path: Path, text: str) -> None:
    os.mkfifo(path)


def another_users(path: Path, text: str) -> None:
    path.write_text(text)
    if os.getuid() == 0:
        os.chown(path, 12345, 12345)
        path.chmod(0o644)
    else:  # a plain user cannot give a file away: one others may write is the same case
        path.chmod(0o646)


UNTRUSTED: dict[str, Callable[[Path, str], None]] = {
    "writable by others": writable_by_others,
    "group-writable": group_writable,
    "a symbolic link": a_link,
    "a FIFO": a_fifo,
    "another user's": another_users,
}


@pytest.mark.parametrize("make", list(UNTRUSTED.values()), ids=list(UNTRUSTED))
def test_the_registry_mirror_setting_follows_the_ownership_rule(
    tmp_path: Path, make: Callable[[Path, str], None]
) -> None:
    config = tmp_path / "config.yaml"
    make(config, CONFIG)
    with pytest.raises(InvalidMirror, match=str(config)):
        registry_mirror({"GPUENV_CONFIG": str(config)})


@pytest.mark.parametrize("make", list(UNTRUSTED.values()), ids=list(UNTRUSTED))
def test_the_matrix_overlay_follows_the_ownership_rule(
    tmp_path: Path, make: Callable[[Path, str], None]
) -> None:
    overlay = tmp_path / "matrix-overlay.yaml"
    make(overlay, OVERLAY)
    with pytest.raises(MatrixError) as refused:
        read_source(str(overlay))
    assert str(overlay) in str(refused.value.problems[0])


def test_the_users_own_files_are_read(tmp_path: Path) -> None:
    config, overlay = tmp_path / "config.yaml", tmp_path / "matrix-overlay.yaml"
    config.write_text(CONFIG)
    overlay.write_text(OVERLAY)
    for path in (config, overlay):
        path.chmod(0o644)
    assert registry_mirror({"GPUENV_CONFIG": str(config)}) == ("127.0.0.1:5000", str(config))
    assert read_source(str(overlay)) == (str(overlay), OVERLAY.encode())
    assert read_source(str(tmp_path / "none.yaml")) is None
