"""A project as the commands after `gpuenv lock` see it: its spec and its lock, checked
to agree (the lock is never re-resolved on the way)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuenv.errors import LockError
from gpuenv.lock.lockfile import LOCK_FILENAME, Lock, check_locked_row, lock_differences, read_lock
from gpuenv.matrix.load import load_matrix
from gpuenv.project.spec import Spec
from gpuenv.project.validate import load_spec


@dataclass(frozen=True)
class Project:
    """A project folder's spec and lock, checked to agree."""

    spec: Spec
    lock: Lock
    lock_path: str


def load_project(directory: str) -> Project:
    """The project in `directory`; LockError when its lock no longer matches the spec or
    the matrix (`gpuenv lock` decides what changes, never a build or a run)."""
    spec = load_spec(directory)
    path = os.path.join(directory, LOCK_FILENAME)
    lock = read_lock(path)
    changes = lock_differences(lock, spec)
    if changes:
        raise LockError(
            f"{LOCK_FILENAME} is out of date: " + "; ".join(changes),
            hint="run `gpuenv lock` (gpuenv never re-resolves on its own), then try again",
        )
    check_locked_row(lock, spec, load_matrix())
    return Project(spec, lock, path)
