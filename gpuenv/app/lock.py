"""`gpuenv lock`: when and how gpuenv.lock changes, and `lock --check`.

Pure policy over files: no terminal, no engine. Each function returns what happened
(with the notes a user should see), and the CLI shows it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from gpuenv.app.own_base import BaseReader, own_base_notes, with_own_base
from gpuenv.common.filelock import exclusive
from gpuenv.common.versions import parse_version
from gpuenv.containers.devcontainer import stale_devcontainer
from gpuenv.errors import GpuenvError, LockError, UsageError
from gpuenv.host.machine import Host
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    Lock,
    check_locked_row,
    lock_differences,
    lock_from_resolution,
    locked_row_problems,
    overlay_differences,
    read_lock,
    recorded_host,
    requirements_hashes,
    write_lock,
)
from gpuenv.lock.overlay import cutoff_time
from gpuenv.matrix.load import Matrix, load_matrix
from gpuenv.matrix.model import Companion
from gpuenv.project.dependencies import check_installable, read_dependencies
from gpuenv.project.overrides import Overrides, spec_for
from gpuenv.project.sources import environment
from gpuenv.project.spec import Spec, is_image_base
from gpuenv.resolution.hostplan import HostPlan
from gpuenv.resolution.pins import Pin
from gpuenv.resolution.resolve import resolve
from gpuenv.resolution.verdicts import Resolution

NoteKind = Literal["info", "warn", "step"]


@dataclass(frozen=True)
class Note:
    kind: NoteKind
    text: str


Notify = Callable[[Note], None]


def no_notes(note: Note) -> None:
    del note


LockStatus = Literal["up-to-date", "written", "updated", "updated-same-image"]


@dataclass(frozen=True)
class LockUpdate:
    status: LockStatus
    pinned: str
    previous_image: str | None = None
    resolution: Resolution | None = None


def checked_cutoff(exclude_newer: str | None) -> str | None:
    """`--exclude-newer`'s value as the UTC time pip reads (None when not given); a
    usage error for anything but a date or a time in UTC."""
    if exclude_newer is None:
        return None
    try:
        return cutoff_time(exclude_newer)
    except ValueError as exc:
        raise UsageError(f"--exclude-newer: {exc}") from None


def differs_from_lock(directory: str, image: str) -> str | None:
    """A warning when `image` (what resolve answers now) is not the image gpuenv.lock
    pins in `directory`; None without a readable lock, or when they agree."""
    try:
        current = read_lock(os.path.join(directory, LOCK_FILENAME))
    except (GpuenvError, OSError):
        return None
    if current.image == image:
        return None
    return (
        f"this answer differs from {LOCK_FILENAME}, which pins {current.image}: builds and "
        "runs use the lock's image (`gpuenv lock --upgrade` re-resolves gpuenv.yaml for "
        "this host)"
    )


def verify_lock(directory: str) -> Lock:
    """`gpuenv lock --check`: the lock, or LockError listing what changed (gpuenv.yaml,
    a dependency file, Python packages not locked yet), or naming the editor's
    devcontainer.json gpuenv wrote from another lock."""
    spec = spec_for(directory, Overrides(), need_file=True)
    current = read_lock(os.path.join(directory, LOCK_FILENAME))
    hashes = requirements_hashes(spec)
    changes = lock_differences(current, spec, hashes)
    if changes:
        raise LockError(
            f"{LOCK_FILENAME} is out of date:\n" + "\n".join(f"  - {c}" for c in changes),
            hint="run `gpuenv lock` and commit gpuenv.lock",
        )

    check_locked_row(current, spec, load_matrix())
    stale = overlay_differences(current, spec, hashes)
    if stale:
        raise LockError(
            f"{LOCK_FILENAME} is out of date:\n" + "\n".join(f"  - {c}" for c in stale),
            hint="run `gpuenv lock` (where a container engine runs) and commit gpuenv.lock",
        )
    editor = stale_devcontainer(directory)
    if editor:
        raise LockError(
            editor,
            hint="run `gpuenv export devcontainer` again, then reopen (or rebuild) the container",
        )
    return current


def update_lock(
    directory: str,
    plan: HostPlan,
    *,
    upgrade: bool = False,
    newest: bool = False,
    notify: Notify = no_notes,
    read_base: BaseReader | None = None,
) -> LockUpdate:
    """`gpuenv lock`: keep an up-to-date lock; on a change keep the locked image while it
    still fits (newest otherwise, always with `upgrade`); without a driver here, plan for
    the host the lock recorded. One writer at a time (LockHeld, exit 9, names another).
    A base of the team's own is read with `read_base` where the lock has not read it
    (and again with `upgrade`: its tag may have moved)."""
    with exclusive(os.path.join(directory, LOCK_FILENAME)):
        return _update_lock(
            directory, plan, upgrade=upgrade, newest=newest, notify=notify, read_base=read_base
        )


def _update_lock(
    directory: str,
    plan: HostPlan,
    *,
    upgrade: bool,
    newest: bool,
    notify: Notify,
    read_base: BaseReader | None,
) -> LockUpdate:
    spec = spec_for(directory, Overrides(), need_file=True)
    path = os.path.join(directory, LOCK_FILENAME)
    existing: Lock | None = None
    if os.path.exists(path):
        try:
            existing = read_lock(path)
        except LockError as exc:
            notify(Note("warn", f"{exc.message}; writing a new lock"))
    matrix = load_matrix()
    if (
        existing is not None
        and not upgrade
        and not plan.given
        and not lock_differences(existing, spec)
    ):
        problems = locked_row_problems(existing, spec, matrix)
        if not problems:
            return LockUpdate("up-to-date", existing.pinned_image)
        notify(Note("warn", "the locked image no longer fits: " + "; ".join(problems)))
        upgrade = True
    host = plan.host(matrix)
    if host.driver is None and existing is not None and not plan.given:
        recorded = recorded_host(existing)
        if recorded is not None:
            host = recorded
            notify(
                Note(
                    "info",
                    f"no NVIDIA driver here: planning for the host in the lock: {host.describe()}",
                )
            )
    prefer = existing.image if existing is not None and not upgrade else None

    based = with_own_base(spec, matrix, read_base, existing, again=upgrade)
    matrix = based.matrix
    pins = project_pins(spec, matrix)
    for note in unknown_companions(pins, matrix):
        notify(Note("warn", note))
    resolution = resolve(spec, matrix, host, prefer=prefer, pins=pins, newest=newest)
    row = resolution.row
    for note in own_base_notes(row, spec):
        notify(Note("warn", note))
    check_installable(spec, row.image, row.python, row.framework_version)
    same_image = existing is not None and existing.image == resolution.row.image
    digest = based.digest or (existing.digest if existing is not None and same_image else "")
    new_lock = _carried(lock_from_resolution(resolution, matrix.version, digest), existing)
    if existing is not None and same_image and not lock_differences(existing, spec):
        # Same spec, same image (a re-resolve for another host): the pushed image holds.
        new_lock = replace(new_lock, extra=existing.extra)
    write_lock(path, new_lock)
    status: LockStatus
    if existing is None:
        status = "written"
    elif same_image:
        status = "updated-same-image"
    else:
        status = "updated"
    return LockUpdate(
        status,
        new_lock.pinned_image,
        previous_image=existing.image if existing is not None else None,
        resolution=resolution,
    )


def _carried(new_lock: Lock, existing: Lock | None) -> Lock:
    """On the same image, the Python packages stay locked (re-resolved, keeping what
    they can, when a requirements file changed: `overlay.sources` tells); on another,
    they are resolved anew, as of the date the lock keeps, if any."""
    if existing is None:
        return new_lock
    if existing.image == new_lock.image:
        return replace(new_lock, overlay=existing.overlay)
    dated = replace(new_lock.overlay, exclude_newer=existing.overlay.exclude_newer)
    return replace(new_lock, overlay=dated)


def resolve_project(
    spec: Spec,
    matrix: Matrix,
    host: Host,
    *,
    newest: bool = False,
    read_base: BaseReader | None = None,
) -> Resolution:
    """What `gpuenv lock` would choose, without writing: the project's pins steer it the
    same way, and what `check` and `lock` refuse is refused the same way (a dependency
    file pip could not read is exit 3 here too, never another answer). A base of the
    team's own is the row the lock recorded for it, else read with `read_base`."""
    existing = None
    if is_image_base(spec.base):
        with contextlib.suppress(GpuenvError, OSError):
            existing = read_lock(os.path.join(spec.project_dir, LOCK_FILENAME))
    matrix = with_own_base(spec, matrix, read_base, existing).matrix
    pins = project_pins(spec, matrix)
    notes = unknown_companions(pins, matrix)
    resolution = resolve(spec, matrix, host, pins=pins, newest=newest)
    row = resolution.row
    notes += own_base_notes(row, spec)
    check_installable(spec, row.image, row.python, row.framework_version)
    return replace(resolution, warnings=(*notes, *resolution.warnings))


def project_pins(spec: Spec, matrix: Matrix | None = None) -> list[Pin]:
    """Every version pin of the spec's dependency sources. Each is checked against what
    an image provides where that is known: the framework's own version always, other
    packages (torchvision, flash-attn, numpy, ...) where the row records them in `ships`;
    so a pin the image's constraint file would refuse fails at lock time where the data
    allows. An exact pin of a companion package (torchvision==0.16.0) also pins the
    framework version its own metadata requires (torch==2.1.0; `matrix.companions`).
    Reading a source may raise SpecError (exit 3)."""
    if spec.framework == "none" or not (spec.requirements or spec.packages):
        return []
    env = environment(None)
    out = []
    collected = read_dependencies(spec)
    for dependency in [*collected.dependencies, *collected.conda_pins]:
        if dependency.specifier and not dependency.constraint and dependency.applies(env):
            pin = Pin(dependency.name, dependency.specifier, dependency.where)
            out.append(pin)
            implied = _companion_pin(pin, matrix) if matrix is not None else None
            if implied is not None:
                out.append(implied)
    return out


def unknown_companions(pins: list[Pin], matrix: Matrix) -> list[str]:
    """A line for each companion pin that recorded releases meet but whose metadata names
    no framework version (tf-keras 2.14): it does not steer the choice, and the user is
    told."""
    out = []
    for pin in pins:
        releases = _companion_releases(pin, matrix)
        unknown = [r for r in releases if r.requires is None]
        if unknown:
            out.append(
                f"{pin}: {pin.name} {', '.join(r.version for r in unknown)} names no "
                f"framework version in its own metadata ({unknown[0].source}): not used to "
                "choose the image"
            )
    return out


def _companion_pin(pin: Pin, matrix: Matrix) -> Pin | None:
    """The framework pin a companion pin implies, from the metadata of each recorded
    release the pin allows: torchvision==0.16.0 -> torch==2.1.0; torchvision>=0.16,<0.17
    (Poetry's ^0.16.0) -> torch ==2.1.0, ==2.1.1 or ==2.1.2, so a range steers as an
    exact pin does. None where no recorded release meets it, or one of those names no
    framework version (then any framework version could do)."""
    releases = _companion_releases(pin, matrix)
    if not releases or any(r.requires is None for r in releases):
        return None
    required = [Requirement(r.requires) for r in releases if r.requires]
    specifiers = tuple(dict.fromkeys(str(r.specifier) for r in required))
    shown = (
        f"{pin.name}=={releases[0].version}"
        if len(releases) == 1
        else f"{pin.name} {releases[0].version} to {releases[-1].version}"
    )
    return Pin(
        required[0].name,
        specifiers[0],
        f"{pin.where}, through {shown}'s Requires-Dist",
        alternatives=specifiers if len(specifiers) > 1 else (),
    )


def _companion_releases(pin: Pin, matrix: Matrix) -> list[Companion]:
    """The recorded releases of the companion `pin` names that its specifier allows
    (build labels ignored: ==0.16.0+cu121 is 0.16.0), oldest first; none for a package
    that is no companion, or an unpinned one."""
    if not pin.specifier:
        return []
    try:
        allowed = SpecifierSet(re.sub(r"\+[\w.]+", "", pin.specifier))
    except InvalidSpecifier:
        return []
    found = [
        c
        for c in matrix.companions
        if c.package == pin.name and allowed.contains(c.version, prereleases=True)
    ]
    return sorted(found, key=lambda c: parse_version(c.version))
