"""Lock the overlay: resolve the project's Python requirements inside the pinned base and
pin every package a build installs on it in gpuenv.lock.

When: `gpuenv lock` does it wherever an engine answers (pulling the base with progress,
which the first build needs anyway); `gpuenv init`, and `gpuenv lock` without an engine,
write a lock that says the overlay is not resolved yet, and the first `build` or `run`
resolves it, writes the lock and says so (`--locked` refuses instead, for CI). A
re-resolve keeps every locked version the change does not force to move (they are the
resolver's constraints first), unless an upgrade asks; what changed is always told.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from gpuenv.app.mirror import configured_mirror
from gpuenv.common.filelock import exclusive
from gpuenv.common.files import file_hash
from gpuenv.engine.protocol import Engine
from gpuenv.errors import EngineError, LockError, ResolutionError, UsageError
from gpuenv.images.progress import PullView
from gpuenv.images.render import python_plan, resolve_files
from gpuenv.images.resolver import OverlayUnresolvable, run_resolver
from gpuenv.images.service import build_network, ensure_base
from gpuenv.lock.hashes import check_user_hashes
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    overlay_sources,
    read_lock,
    requirements_hashes,
    write_lock,
)
from gpuenv.lock.overlay import (
    NOTHING,
    LockedPackage,
    Overlay,
    changes,
    overlay_from_report,
    sdist_notes,
)
from gpuenv.lock.project import Project, load_project
from gpuenv.project.dependencies import InstallPlan
from gpuenv.project.packages import normalize


@dataclass(frozen=True)
class OverlayUpdate:
    project: Project
    changes: tuple[str, ...]  # `+ name v`, `- name v`, `~ name a → b`
    notes: tuple[str, ...] = ()  # what a user should know (sdists, preferences dropped)

    def summary(self) -> list[str]:
        """What a user is told: how many packages are pinned, what changed, the notes."""
        overlay = self.project.lock.overlay
        count = len(overlay.packages)
        first = f"gpuenv.lock pins {count} Python package{'s' if count != 1 else ''} on the image"
        if overlay.exclude_newer:
            first += f", as of {overlay.exclude_newer}"
        if not self.changes:
            first += " (unchanged)"
        else:
            first += "; commit gpuenv.lock"
        return [first, *(f"  {line}" for line in self.changes), *self.notes]


def lock_overlay(
    project: Project,
    engine: Engine,
    view: PullView,
    *,
    upgrade: bool = False,
    upgrade_packages: Collection[str] = (),
    exclude_newer: str | None = None,
    on_line: Callable[[str], None] = lambda _: None,
) -> OverlayUpdate:
    """Resolve the project's overlay in its pinned base (pulled when missing) and write
    it into the lock. ResolutionError (exit 4) when the requirements cannot be resolved
    on the image, or a package cannot be pinned to the byte; SpecError (exit 3) when a
    hash the project wrote does not match the file resolved."""
    spec, lock = project.spec, project.lock
    sources = overlay_sources(spec, requirements_hashes(spec))
    cutoff = lock.overlay.exclude_newer if exclude_newer is None else exclude_newer
    plan = python_plan(spec, lock)
    notes: list[str] = []
    read_as = file_hash(project.lock_path)
    if plan is None or plan.empty:
        overlay = replace(NOTHING, sources=sources, paths=plan.paths if plan else ())
    else:
        project, local = ensure_base(project, engine, view, configured_mirror())
        lock = project.lock
        read_as = file_hash(project.lock_path)  # the digest pinned on a first pull
        moving = {normalize(name) for name in upgrade_packages}
        keep = [] if upgrade else [p for p in lock.overlay.packages if p.name not in moving]
        report = _resolve(engine, local, plan, keep, cutoff, on_line, notes)
        overlay, refused = overlay_from_report(report, plan.options, sources)
        if refused:
            raise ResolutionError(
                "these requirements cannot be locked to the byte: "
                + "; ".join(str(item) for item in refused),
                hint="gpuenv installs only what gpuenv.lock pins with a hash",
            )
        check_user_hashes(plan, overlay)
        overlay = replace(overlay, paths=plan.paths, exclude_newer=cutoff)
        notes += sdist_notes(overlay)
    diff = changes(lock.overlay if lock.overlay.resolved else None, overlay)
    new_lock = replace(lock, overlay=overlay, requirements=requirements_hashes(spec))
    with exclusive(project.lock_path):
        if file_hash(project.lock_path) != read_as:
            raise LockError(
                f"{LOCK_FILENAME} changed while its Python packages were resolved (another "
                "gpuenv lock, or an edit): nothing was written",
                hint="run the command again",
            )
        write_lock(project.lock_path, new_lock)
    return OverlayUpdate(Project(spec, new_lock, project.lock_path), tuple(diff), tuple(notes))


def notice_line(notice: Callable[[str], None]) -> Callable[[str], None]:
    """The resolver's lines a user needs (gpuenv's own, not pip's)."""

    def shown(line: str) -> None:
        if line.startswith("gpuenv: ") and not line.startswith("gpuenv: pip install"):
            notice(line.removeprefix("gpuenv: "))

    return shown


def locked_overlay(directory: str) -> Overlay:
    """The Python packages gpuenv.lock pins now, as it is on disk."""
    return read_lock(os.path.join(directory, LOCK_FILENAME)).overlay


def relock_overlay(
    directory: str,
    connect: Callable[[], Engine],
    view: Callable[[], PullView],
    *,
    upgrade: bool = False,
    upgrade_packages: Collection[str] = (),
    exclude_newer: str | None = None,
    on_line: Callable[[str], None] = lambda _: None,
) -> OverlayUpdate | str:
    """`gpuenv lock`'s second half, after the image is pinned: resolve the Python
    packages when they are not locked for the requirements as they are (or an upgrade
    asks). The update; or, when nothing needs doing or no engine answers, a sentence
    that says so (without an engine the lock stays valid, marked unresolved, and the
    first build resolves it; `--upgrade-package` needs one: EngineError)."""
    project = load_project(directory, "update")
    moved = exclude_newer is not None and exclude_newer != project.lock.overlay.exclude_newer
    if not (project.stale or upgrade or upgrade_packages or moved):
        return "the Python packages in gpuenv.lock are up to date"
    unknown = [n for n in upgrade_packages if project.lock.overlay.get(normalize(n)) is None]
    if unknown and project.lock.overlay.resolved:
        raise UsageError(
            f"--upgrade-package {', '.join(unknown)}: not a package gpuenv.lock pins",
            hint="`gpuenv lock --upgrade` moves every package",
        )
    try:
        engine = connect()
        engine.ping()
    except EngineError as exc:
        if upgrade_packages or moved:
            raise
        state = (
            f"the Python packages in {LOCK_FILENAME} are stale ({'; '.join(project.stale)})"
            if project.lock.overlay.resolved
            else "the Python packages are not locked yet"
        )
        return (
            f"{state}: no container engine answers ({exc.message}); gpuenv resolves them in "
            "the base image with `gpuenv lock` where an engine runs, or on the next "
            "`gpuenv build` (which writes the lock)"
        )
    return lock_overlay(
        project,
        engine,
        view(),
        upgrade=upgrade or moved,
        upgrade_packages=upgrade_packages,
        exclude_newer=exclude_newer,
        on_line=on_line,
    )


def _resolve(
    engine: Engine,
    image: str,
    plan: InstallPlan,
    keep: list[LockedPackage],
    cutoff: str,
    on_line: Callable[[str], None],
    notes: list[str],
) -> dict[str, Any]:
    """The resolver's report, keeping the locked versions `keep` where the requirements
    allow: first all of them, then all but the project's own requirements, then none
    (each fallback is noted)."""
    direct = {d.name for d in (*plan.install, *plan.no_isolation)}
    attempts = [keep]
    if any(p.name in direct for p in keep):
        attempts.append([p for p in keep if p.name not in direct])
    if keep:
        attempts.append([])
    network = build_network()
    for number, attempt in enumerate(attempts):
        files = resolve_files(plan, [p.pin() for p in attempt], cutoff)
        try:
            return run_resolver(engine, image, files, network=network, on_line=on_line)
        except OverlayUnresolvable:
            if number == len(attempts) - 1:
                raise
            kept = "the other locked versions" if attempts[number + 1] else "no locked version"
            notes.append(
                "the locked versions could not all be kept with the requirements as they are "
                f"now: resolved again keeping {kept}"
            )
    raise AssertionError("unreachable: the last attempt returns or raises")


def pylock_text(directory: str) -> str:
    """`gpuenv export pylock`: the lock's packages as pylock.toml; LockError (exit 5)
    while they are not locked for the requirements as they are."""
    from gpuenv.lock.pylock import render_pylock

    return render_pylock(load_project(directory, "locked").lock)
