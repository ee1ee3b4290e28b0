"""A project as the commands after `gpuenv lock` see it: its spec and its lock, checked
to agree (the base image is never re-resolved on the way)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuenv.errors import LockError
from gpuenv.lock.locked import Freshness
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    Lock,
    check_locked_row,
    lock_differences,
    overlay_differences,
    read_lock,
    requirements_hashes,
)
from gpuenv.matrix.load import load_matrix
from gpuenv.project.spec import Spec
from gpuenv.project.validate import load_spec


@dataclass(frozen=True)
class Project:
    """A project folder's spec and lock, checked to agree. `stale`: why the lock's
    Python packages must be resolved again (only with the `update` policy)."""

    spec: Spec
    lock: Lock
    lock_path: str
    stale: tuple[str, ...] = ()


def load_project(directory: str, freshness: Freshness = "locked") -> Project:
    """The project in `directory`; LockError (exit 5) when its lock no longer matches the
    spec or the matrix (`gpuenv lock` decides the image, never a build or a run), or
    when its Python packages are not locked for the requirements as they are, unless
    `freshness` says to re-resolve them (`update`) or to use them as they are (`frozen`):
    then `stale` says why they are not current."""
    spec = load_spec(directory)
    path = os.path.join(directory, LOCK_FILENAME)
    lock = read_lock(path)
    current = requirements_hashes(spec)
    changes = [c for c in lock_differences(lock, spec, current) if "requirements file" not in c]
    if changes:
        raise LockError(
            f"{LOCK_FILENAME} is out of date: " + "; ".join(changes),
            hint="run `gpuenv lock` (gpuenv never re-resolves the image on its own), then "
            "try again",
        )
    check_locked_row(lock, spec, load_matrix())
    stale = tuple(overlay_differences(lock, spec, current))
    if stale and freshness == "locked":
        raise LockError(
            f"{LOCK_FILENAME} is out of date: " + "; ".join(stale),
            hint="run `gpuenv lock` and commit gpuenv.lock (`--locked` refuses to re-resolve)",
        )
    return Project(spec, lock, path, stale)
