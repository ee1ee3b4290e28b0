"""`gpuenv lock`, whole: the image half (`app.lock`: resolve gpuenv.yaml, pin the image),
then the Python packages half (`app.overlay`: resolve them in the pinned base image), or
`--check`, which writes nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from gpuenv.app.lock import LockUpdate, Notify, checked_cutoff, update_lock, verify_lock
from gpuenv.app.overlay import locked_overlay, notice_line, relock_overlay
from gpuenv.app.own_base import engine_reader
from gpuenv.engine.protocol import Engine
from gpuenv.errors import UsageError
from gpuenv.images.progress import PullView
from gpuenv.lock.lockfile import LOCK_FILENAME
from gpuenv.resolution.hostplan import HostPlan


@dataclass(frozen=True)
class LockRequest:
    """What `gpuenv lock` was asked: the host to plan for, `--check` (write nothing),
    `--upgrade` (and `--newest`, which implies it), the packages to move and the date
    to resolve them as of."""

    plan: HostPlan
    check_only: bool = False
    upgrade: bool = False
    newest: bool = False
    upgrade_packages: tuple[str, ...] = ()
    exclude_newer: str | None = None


@dataclass(frozen=True)
class PackagesLocked:
    """The Python packages' half: whether they are resolved, how many the lock pins, what
    changed, the lock's note on them; and what a user is told: `summary` (the update's
    lines) or `said` (why nothing was resolved), never both."""

    resolved: bool
    count: int
    changes: tuple[str, ...]
    note: str
    summary: tuple[str, ...] = ()
    said: str | None = None

    def to_data(self) -> dict[str, object]:
        """`lock --json`'s `packages`."""
        return {
            "resolved": self.resolved,
            "count": self.count,
            "changes": list(self.changes),
            "note": self.note,
        }


@dataclass(frozen=True)
class LockOutcome:
    """What `gpuenv lock` did: the lock's path; with `--check`, the image the lock pins
    (`checked`), else the image half (`update`) and the packages half (`packages`)."""

    path: str
    checked: str | None = None
    update: LockUpdate | None = None
    packages: PackagesLocked | None = None


@dataclass(frozen=True)
class Steps:
    """How `lock_project` reports as it goes: notes of the resolution (`notify`), the
    image half once it is done (`image_locked`, before the packages are resolved), each
    line of the resolver (`line`); the engine and the pull's view, for a base of the
    team's own (read from the image) and for the packages (resolved in it)."""

    notify: Notify
    image_locked: Callable[[LockUpdate], None]
    line: Callable[[str], None]
    engine: Callable[[], Engine]
    view: Callable[[], PullView]


def lock_project(directory: str, request: LockRequest, steps: Steps) -> LockOutcome:
    """`gpuenv lock`: with `check_only`, LockError where the lock is stale, else the image
    it pins; otherwise pin the image (`app.lock.update_lock`), then the Python packages
    (`app.overlay.relock_overlay`). UsageError for flags that do not go together, or a
    date `exclude_newer` cannot be read as."""
    upgrade = request.upgrade or request.newest
    if request.check_only and (upgrade or request.upgrade_packages or request.exclude_newer):
        raise UsageError(
            "--check cannot be combined with --upgrade, --newest, --upgrade-package or "
            "--exclude-newer: --check writes nothing"
        )
    cutoff = checked_cutoff(request.exclude_newer)
    path = os.path.join(directory, LOCK_FILENAME)
    if request.check_only:
        return LockOutcome(path, checked=verify_lock(directory).pinned_image)
    update = update_lock(
        directory,
        request.plan,
        upgrade=upgrade,
        newest=request.newest,
        notify=steps.notify,
        read_base=engine_reader(steps.engine, steps.view),
    )
    steps.image_locked(update)
    outcome = relock_overlay(
        directory,
        steps.engine,
        steps.view,
        upgrade=upgrade,
        upgrade_packages=request.upgrade_packages,
        exclude_newer=cutoff,
        on_line=notice_line(steps.line),
    )
    if isinstance(outcome, str):
        overlay = locked_overlay(directory)
        packages = PackagesLocked(
            overlay.resolved, len(overlay.packages), (), overlay.note, said=outcome
        )
    else:
        overlay = outcome.project.lock.overlay
        packages = PackagesLocked(
            overlay.resolved,
            len(overlay.packages),
            outcome.changes,
            overlay.note,
            summary=tuple(outcome.summary()),
        )
    return LockOutcome(path, update=update, packages=packages)
