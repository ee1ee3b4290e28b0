"""The validated-matrix cache: used when it is exactly what this code wrote for these
files, rebuilt otherwise, never an error, never a link followed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuenv.common import cache, dirs
from gpuenv.errors import MatrixError
from gpuenv.matrix import load as matrix_module
from gpuenv.matrix.load import Matrix, load_matrix, matrix_sources, validate_matrix

from ..conftest import MATRICES


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(dirs.CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def matrices(tmp_path: Path) -> Path:
    folder = tmp_path / "matrices"
    shutil.copytree(MATRICES, folder)
    return folder


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders a fresh parse ran for (a cache miss), in order."""
    calls: list[str] = []
    real = matrix_module.validate_matrix

    def counting(directory: str, sources: list[matrix_module.Source]) -> Matrix:
        calls.append(directory)
        return real(directory, sources)

    monkeypatch.setattr(matrix_module, "validate_matrix", counting)
    return calls


def values(matrix: Matrix) -> list[object]:
    return [getattr(matrix, f.name) for f in dataclasses.fields(matrix)]


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("matrix-*.json"))


def test_second_load_comes_from_the_cache(
    cache_dir: Path, matrices: Path, parses: list[str]
) -> None:
    first = load_matrix(str(matrices))
    second = load_matrix(str(matrices))
    assert parses == [str(matrices)]
    assert values(second) == values(first)
    assert values(second) == values(validate_matrix(str(matrices), matrix_sources(str(matrices))))
    assert second.directory == str(matrices)
    (entry,) = entries(cache_dir)
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".tmp")]


def test_the_same_files_elsewhere_share_the_entry(
    cache_dir: Path, matrices: Path, tmp_path: Path, parses: list[str]
) -> None:
    load_matrix(str(matrices))
    other = tmp_path / "other"
    shutil.copytree(matrices, other)
    assert load_matrix(str(other)).directory == str(other)
    assert parses == [str(matrices)]


def _rewrite(entry: Path, change: Callable[[bytes, bytes], tuple[bytes, bytes]]) -> None:
    head, _, body = entry.read_bytes().partition(b"\n")
    head, body = change(head, body)
    entry.write_bytes(head + b"\n" + body)


def _header(**fields: object) -> Callable[[bytes, bytes], tuple[bytes, bytes]]:
    def change(head: bytes, body: bytes) -> tuple[bytes, bytes]:
        return json.dumps({**json.loads(head), **fields}).encode(), body

    return change


def _resealed(body: bytes) -> Callable[[bytes, bytes], tuple[bytes, bytes]]:
    """Another body with a checksum that matches it: data of the wrong shape."""

    def change(head: bytes, _: bytes) -> tuple[bytes, bytes]:
        header = {**json.loads(head), "sha256": hashlib.sha256(body).hexdigest()}
        return json.dumps(header).encode(), body

    return change


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": lambda e: e.write_bytes(e.read_bytes()[: e.stat().st_size // 2]),
    "empty": lambda e: e.write_bytes(b""),
    "header only": lambda e: e.write_bytes(e.read_bytes().partition(b"\n")[0]),
    "one body byte changed": lambda e: _rewrite(e, lambda h, b: (h, b.replace(b"580", b"581", 1))),
    "not JSON": lambda e: e.write_bytes(b"\x00\xff garbage\n\x80\x81"),
    "not UTF-8": lambda e: _rewrite(e, lambda h, b: (h, b"\xff" + b)),
    "another format": lambda e: _rewrite(e, _header(format=cache.FORMAT + 1)),
    "another key": lambda e: _rewrite(e, _header(key="0" * 64)),
    "wrong checksum": lambda e: _rewrite(e, _header(sha256="0" * 64)),
    "header not a mapping": lambda e: _rewrite(e, lambda h, b: (b"[1, 2]", b)),
    "resealed: a list": lambda e: _rewrite(e, _resealed(b"[]")),
    "resealed: a field missing": lambda e: _rewrite(
        e, _resealed(json.dumps({"images": [], "gpus": [], "version": "x"}).encode())
    ),
    "resealed: a short row": lambda e: _rewrite(
        e,
        _resealed(
            json.dumps(
                {
                    "images": [["pytorch"]],
                    "minor_compat": [],
                    "toolkits": [],
                    "architectures": [],
                    "gpus": [],
                    "version": "x",
                }
            ).encode()
        ),
    ),
    "resealed: a bad pair": lambda e: _rewrite(
        e,
        _resealed(
            json.dumps(
                {
                    "images": [],
                    "minor_compat": [[True, "525"]],
                    "toolkits": [],
                    "architectures": [],
                    "gpus": [],
                    "version": "x",
                }
            ).encode()
        ),
    ),
    "a directory": lambda e: (e.unlink(), e.mkdir()),
    "a FIFO": lambda e: (e.unlink(), os.mkfifo(e)),
}


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_a_damaged_entry_is_rebuilt_never_trusted(
    cache_dir: Path, matrices: Path, parses: list[str], damage: str
) -> None:
    good = load_matrix(str(matrices))
    (entry,) = entries(cache_dir)
    DAMAGE[damage](entry)
    again = load_matrix(str(matrices))
    assert values(again) == values(good)
    assert len(parses) == 2  # a fresh parse, not the damaged entry
    if entry.is_file() and not stat.S_ISFIFO(entry.stat().st_mode):
        load_matrix(str(matrices))
        assert len(parses) == 2  # and the entry was written again


def test_a_changed_byte_misses(cache_dir: Path, matrices: Path, parses: list[str]) -> None:
    first = load_matrix(str(matrices))
    path = matrices / "ngc-pytorch.yaml"
    path.write_bytes(path.read_bytes().replace(b'min_driver: "545"', b'min_driver: "546"', 1))
    second = load_matrix(str(matrices))
    assert len(parses) == 2 and second.version != first.version
    assert "546" in {str(r.min_driver) for r in second.images} - {
        str(r.min_driver) for r in first.images
    }
    assert len(entries(cache_dir)) == 2


def test_problems_come_from_a_fresh_parse(cache_dir: Path, matrices: Path) -> None:
    load_matrix(str(matrices))
    path = matrices / "ngc-pytorch.yaml"
    path.write_text(path.read_text().replace('min_driver: "545"', 'min_driver: "five"', 1))
    with pytest.raises(MatrixError) as info:
        load_matrix(str(matrices))
    (problem,) = info.value.problems
    assert problem.file.endswith("ngc-pytorch.yaml") and problem.line and problem.column
    assert "'five' is not a driver version" in str(problem)
    assert len(entries(cache_dir)) == 1  # nothing stored for the broken files


def test_another_gpuenv_version_misses(
    cache_dir: Path, matrices: Path, parses: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    load_matrix(str(matrices))
    monkeypatch.setattr("gpuenv.matrix.files.__version__", "999.0")
    load_matrix(str(matrices))
    assert len(parses) == 2


def test_a_planted_link_is_not_followed(
    cache_dir: Path, matrices: Path, tmp_path: Path, parses: list[str]
) -> None:
    load_matrix(str(matrices))
    (entry,) = entries(cache_dir)
    # The link points at a valid entry: following it would be a hit.
    target = tmp_path / "elsewhere.json"
    target.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(target)
    load_matrix(str(matrices))
    assert len(parses) == 2
    assert not entry.is_symlink() and entry.is_file()  # replaced, not written through
    assert target.read_bytes() == entry.read_bytes()


def test_a_linked_cache_folder_is_not_used(
    tmp_path: Path, matrices: Path, parses: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv(dirs.CACHE_ENV, str(link))
    load_matrix(str(matrices))
    load_matrix(str(matrices))
    assert len(parses) == 2 and list(real.iterdir()) == []


def test_a_folder_of_another_user_is_not_used(
    cache_dir: Path, matrices: Path, parses: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    load_matrix(str(matrices))
    (entry,) = entries(cache_dir)
    before = entry.stat().st_ino
    monkeypatch.setattr(os, "getuid", lambda: os.stat(cache_dir).st_uid + 1)
    load_matrix(str(matrices))
    load_matrix(str(matrices))
    assert len(parses) == 3
    assert entry.stat().st_ino == before  # not written again either


def test_a_loose_folder_is_made_private(cache_dir: Path, matrices: Path) -> None:
    cache_dir.mkdir()
    cache_dir.chmod(0o777)
    load_matrix(str(matrices))
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert len(entries(cache_dir)) == 1


@pytest.mark.parametrize("blocked", ["a file", "under a file"])
def test_no_usable_folder_means_no_cache(
    tmp_path: Path,
    matrices: Path,
    parses: list[str],
    monkeypatch: pytest.MonkeyPatch,
    blocked: str,
) -> None:
    (tmp_path / "file").write_text("not a folder")
    path = tmp_path / "file" if blocked == "a file" else tmp_path / "file" / "cache"
    monkeypatch.setenv(dirs.CACHE_ENV, str(path))
    assert values(load_matrix(str(matrices)))[:-1] == values(load_matrix(str(matrices)))[:-1]
    assert len(parses) == 2


def test_an_unwritable_folder_means_no_cache(
    monkeypatch: pytest.MonkeyPatch, matrices: Path, parses: list[str]
) -> None:
    """/proc takes no files, for root either (CI runs as root): no cache, no error."""
    monkeypatch.setenv(dirs.CACHE_ENV, "/proc")
    load_matrix(str(matrices))
    load_matrix(str(matrices))
    assert len(parses) == 2
    assert not [name for name in os.listdir("/proc") if name.startswith("matrix-")]


def test_old_entries_are_pruned(cache_dir: Path) -> None:
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(cache.KEEP + 5)]
    for i, key in enumerate(keys):
        assert cache.store("matrix", key, {"n": i})
        os.utime(cache_dir / f"matrix-{key[:32]}.json", (1000 + i, 1000 + i))
    assert len(entries(cache_dir)) == cache.KEEP
    assert cache.load("matrix", keys[-1]) == {"n": len(keys) - 1}
    assert cache.load("matrix", keys[-cache.KEEP]) == {"n": len(keys) - cache.KEEP}
    assert cache.load("matrix", keys[0]) is None


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ([("a", b"bc")], [("ab", b"c")]),
        ([("a", b"b"), ("c", b"d")], [("a", b"b3:c\n1:d")]),
        ([("a", b"")], []),
        ([("a", b"x"), ("b", b"y")], [("b", b"y"), ("a", b"x")]),
    ],
)
def test_digest_frames_each_source(
    one: list[tuple[str, bytes]], other: list[tuple[str, bytes]]
) -> None:
    assert cache.digest(one) != cache.digest(other)
    assert cache.digest(one) == cache.digest(list(one))


def test_default_folder_is_the_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gpuenv.common.dirs import user_cache_dir

    assert user_cache_dir({"GPUENV_CACHE_DIR": "/somewhere"}) == "/somewhere"
    monkeypatch.delenv("GPUENV_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert user_cache_dir() == str(tmp_path / "gpuenv")


@pytest.mark.parametrize("xdg", [None, "", "   ", "/srv/cache", "relative/cache"])
def test_the_folder_is_the_one_platformdirs_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, xdg: str | None
) -> None:
    import platformdirs

    from gpuenv.common.dirs import user_cache_dir

    monkeypatch.delenv("GPUENV_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert user_cache_dir() == platformdirs.user_cache_dir("gpuenv", appauthor=False)
