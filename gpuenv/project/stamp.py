"""Build stamps: the no-op `gpuenv build` without parsing anything.

After a build (or a check that found the image), gpuenv records which tag the project's
inputs gave, with each input file's size and modification time, in the user's cache
folder. The next `gpuenv build` only stats those files: when none changed, the tag is
known and one question to the engine ("do you have it?") finishes the command. Like
make, a stamp trusts file times; any doubt (a missing, unreadable or older stamp) falls
back to the full path, which reads the spec and lock and renders.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from gpuenv import __version__
from gpuenv.common import nesting
from gpuenv.common.dirs import make_user_dir, user_cache_dir

STAMP_FORMAT = 2
# The bytes a stamp's file name keeps as they are; any other is written %XX.
_KEPT = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_LONGEST = 200  # bytes of a name; a longer one is hashed (names stop at 255)


def stamp_dir() -> str:
    """The build stamps' folder, in the user cache."""
    return os.path.join(user_cache_dir(), "builds")


def _path(project_dir: str, bake: bool) -> str:
    """The project's stamp: named by its folder's path, %-escaped (a hash for a path too
    long to be a name), so that no hashing, and no OpenSSL (~5 ms to load here), is on
    the way to every run.

    >>> os.path.basename(_path("/work/my proj", True))
    '%2Fwork%2Fmy%20proj+bake.json'
    """
    raw = os.fsencode(os.path.abspath(project_dir))
    name = "".join(chr(byte) if byte in _KEPT else f"%{byte:02X}" for byte in raw)
    name += "+bake" if bake else ""  # "+" is escaped in a path: no path ends so
    if len(name) > _LONGEST:
        name = hashlib.sha256(raw + (b"\0bake" if bake else b"")).hexdigest()  # never "%2F…"
    return os.path.join(stamp_dir(), f"{name}.json")


def _stat(path: str) -> list[int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [info.st_mtime_ns, info.st_size, info.st_ino]


def fresh(project_dir: str, bake: bool) -> dict[str, Any] | None:
    """The stamp recorded for the project, if no input changed since; else None."""
    try:
        with open(_path(project_dir, bake), encoding="utf-8") as handle:
            stamp = nesting.loads(json.loads, handle.read())
        if stamp.get("format") != STAMP_FORMAT or stamp.get("gpuenv") != __version__:
            return None
        if stamp.get("mirror") != (os.environ.get("GPUENV_REGISTRY_MIRROR") or ""):
            return None
        for path, recorded in stamp["inputs"].items():
            if _stat(path) != recorded:
                return None
        if not isinstance(stamp["tag"], str):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return dict(stamp)


def fresh_tag(project_dir: str, bake: bool) -> str | None:
    """The tag recorded for the project, if no input changed since; else None."""
    stamp = fresh(project_dir, bake)
    return str(stamp["tag"]) if stamp else None


def record(
    project_dir: str,
    bake: bool,
    tag: str,
    inputs: Iterable[str],
    project: Mapping[str, Any] | None = None,
) -> None:
    """Remember that these input files (as they are now) give `tag`, and what `gpuenv run`
    needs of the validated spec and lock (`project`). Best effort."""
    stats = {os.path.abspath(p): _stat(p) for p in inputs}
    if any(value is None for value in stats.values()):
        return
    stamp = {
        "format": STAMP_FORMAT,
        "gpuenv": __version__,
        "mirror": os.environ.get("GPUENV_REGISTRY_MIRROR") or "",
        "tag": tag,
        "inputs": stats,
        "project": dict(project or {}),
    }
    path = _path(project_dir, bake)
    try:
        make_user_dir(os.path.dirname(path), 0o755)
        temp = f"{path}.{os.getpid()}"
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(stamp, handle)
        os.replace(temp, path)
    except OSError:
        return
