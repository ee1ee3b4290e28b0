"""The files the matrix is made of, read without loading the matrix: the shipped (or
GPUENV_MATRIX_DIR) matrices and the user's overlay. Their bytes, with gpuenv's version,
are the matrix cache's key (`load.load_matrix`) and a part of the key of anything judged
against the matrix (`run.preflight`)."""

from __future__ import annotations

import os
import pwd
import warnings
from typing import NamedTuple

from gpuenv import __version__
from gpuenv.common import cache
from gpuenv.common.dirs import DATA_ENV, user_data_dir
from gpuenv.common.resources import data_dir
from gpuenv.common.userconfig import UserConfigError, read_owned
from gpuenv.errors import GpuenvWarning, MatrixError, Problem, file_error

FILENAME = "matrix-overlay.yaml"


def default_matrix_dir() -> str:
    """Where the matrices live: GPUENV_MATRIX_DIR, the installed wheel, or the source tree."""
    return os.environ.get("GPUENV_MATRIX_DIR") or data_dir("matrices")


class Source(NamedTuple):
    """One file the matrix is made from."""

    path: str
    data: bytes

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def matrix_sources(directory: str) -> list[Source]:
    """The matrix files of `directory`, read once: their bytes are both the cache key
    and what is parsed."""
    names = (
        sorted(n for n in os.listdir(directory) if n.endswith(".yaml"))
        if os.path.isdir(directory)
        else []
    )
    files = [os.path.join(directory, name) for name in names]
    if not files:
        raise MatrixError(
            [Problem(directory, None, None, None, "no matrix files (*.yaml) found")],
            hint="reinstall gpuenv, or point GPUENV_MATRIX_DIR at a folder of matrices",
        )
    sources = []
    for file in files:
        with open(file, "rb") as handle:
            sources.append(Source(file, handle.read()))
    return sources


def overlay_path() -> str:
    """The user's overlay: in the user data folder (`dirs.user_data_dir`)."""
    return os.path.join(user_data_dir(), FILENAME)


def read_source(path: str | None = None) -> tuple[str, bytes] | None:
    """The overlay's path and bytes, or None when there is none (the usual case)."""
    path = path or overlay_path()
    try:
        data = read_owned(path, "the matrix overlay")  # its rows name images: the user's
    except UserConfigError as exc:
        raise MatrixError(
            [Problem(path, None, None, None, str(exc))],
            hint="the matrix overlay decides which images gpuenv uses: fix its owner and mode",
        ) from None
    except PermissionError as exc:
        owner = _owner(path)
        if owner is not None and owner != os.getuid():
            # Another user's data folder (a GPUENV_DATA_DIR inherited through sudo or
            # setpriv): the overlay is per user, so theirs is not ours to use or repair.
            warnings.warn(
                f"the matrix overlay {path} belongs to another user ({_user_name(owner)}) "
                f"and cannot be read: using the shipped matrix; point {DATA_ENV} at a "
                "folder of yours (or unset it) to use your own overlay",
                GpuenvWarning,
                stacklevel=2,
            )
            return None
        raise file_error(exc, "read", path) from None
    except OSError as exc:
        raise file_error(exc, "read", path) from None
    return None if data is None else (path, data)


def _owner(path: str) -> int | None:
    """The owner of `path`, or of the nearest folder above it that can be looked at."""
    while True:
        try:
            return os.stat(path).st_uid
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return None
            path = parent


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def key_parts(source: tuple[str, bytes] | None) -> list[tuple[str, bytes]]:
    """What the overlay adds to the matrix cache's key: its bytes, when there is one."""
    return [(f"overlay:{FILENAME}", source[1])] if source else []


def matrix_key(
    directory: str, *, with_overlay: bool = True
) -> tuple[str, list[Source], tuple[str, bytes] | None]:
    """The matrix cache's key for the matrices in `directory` (and the overlay), with the
    sources and the overlay read for it (parsed only on a miss)."""
    sources = matrix_sources(directory)
    extra = read_source() if with_overlay else None
    named = [*((s.name, s.data) for s in sources), *key_parts(extra)]
    return cache.digest([("gpuenv", __version__.encode()), *named]), sources, extra
