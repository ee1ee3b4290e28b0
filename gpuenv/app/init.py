"""`gpuenv init`: the project's own pins read, gpuenv.yaml written, resolved, locked."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuenv.app.lock import Note, Notify, no_notes, project_pins, unknown_companions
from gpuenv.common.filelock import exclusive
from gpuenv.common.files import atomic_write
from gpuenv.errors import (
    Problem,
    ResolutionError,
    SpecError,
    UsageError,
)
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    lock_from_resolution,
    write_lock,
)
from gpuenv.matrix.load import load_matrix
from gpuenv.matrix.model import FRAMEWORK_NAMES
from gpuenv.project.dependencies import check_installable
from gpuenv.project.detect import detect_project, render_spec, version_from_specifier
from gpuenv.project.overrides import Overrides, checked_overrides
from gpuenv.project.spec import SPEC_FILENAME, GpuRequest
from gpuenv.project.unread import FIXES, unread_pins
from gpuenv.project.validate import parse_spec_text
from gpuenv.resolution.hostplan import HostPlan
from gpuenv.resolution.resolve import resolve
from gpuenv.resolution.verdicts import Resolution


@dataclass(frozen=True)
class Initialized:
    """What `gpuenv init` wrote: the resolution it locked, and the spec's and the
    lock's paths."""

    resolution: Resolution
    spec: str
    lock: str


def init_project(
    directory: str,
    overrides: Overrides,
    plan: HostPlan,
    *,
    force: bool = False,
    strict_driver: bool = False,
    newest: bool = False,
    notify: Notify = no_notes,
) -> Initialized:
    """`gpuenv init`: detect the project's pins, write gpuenv.yaml, resolve, write the
    lock. When no image fits, the spec is still written (to edit) and no lock is.
    `strict_driver` is written into the spec; `newest` is how this first lock resolves.
    The flags in `overrides` are checked first (a bad constraint is a usage error)."""
    overrides = checked_overrides(*overrides)
    lock = os.path.join(directory, LOCK_FILENAME)
    with exclusive(lock):
        resolution = _init_project(
            directory,
            overrides,
            plan,
            force=force,
            strict_driver=strict_driver,
            newest=newest,
            notify=notify,
        )
    return Initialized(resolution, os.path.join(directory, SPEC_FILENAME), lock)


def _init_project(
    directory: str,
    overrides: Overrides,
    plan: HostPlan,
    *,
    force: bool,
    strict_driver: bool,
    newest: bool,
    notify: Notify,
) -> Resolution:
    spec_path = os.path.join(directory, SPEC_FILENAME)
    lock_path = os.path.join(directory, LOCK_FILENAME)
    existing = [p for p in (spec_path, lock_path) if os.path.exists(p)]
    if existing and not force:
        names = " and ".join(os.path.basename(p) for p in existing)
        raise UsageError(
            f"{names} already exist{'s' if len(existing) == 1 else ''} in {directory}",
            hint="edit gpuenv.yaml and run `gpuenv lock`, "
            "or use `gpuenv init --force` to start over",
        )
    matrix = load_matrix()
    host = plan.host(matrix)
    detected = detect_project(directory, overrides.framework)
    _refuse_unread_pins(directory, overrides, detected.version)
    chosen_framework = overrides.framework or detected.framework
    if chosen_framework is None:
        chosen_framework = "pytorch"
        read = ", ".join(detected.requirements) or "any file gpuenv reads"
        notify(
            Note(
                "info",
                f"no framework found in {read} (requirements.txt, requirements/base.txt, "
                "pyproject.toml, environment.yml); using pytorch, the newest image that "
                "fits: pin a version in gpuenv.yaml",
            )
        )
    same_framework = chosen_framework == detected.framework
    text = render_spec(
        directory,
        detected,
        framework=chosen_framework,
        version=overrides.version or (detected.version if same_framework else None),
        python=overrides.python or detected.python,
        cuda=overrides.cuda,
        gpus=GpuRequest("all"),
        strict_driver=strict_driver,
    )
    spec = parse_spec_text(text, directory)
    for found in detected.found:
        notify(Note("step", f"found {found}"))
    if detected.framework and not same_framework:
        notify(
            Note("warn", f"found {detected.framework_from}; gpuenv.yaml uses {chosen_framework}")
        )
    for note in detected.also:
        notify(Note("warn", note))

    pins = project_pins(spec, matrix)
    for note in unknown_companions(pins, matrix):
        notify(Note("warn", note))
    try:
        resolution = resolve(spec, matrix, host, pins=pins, newest=newest)
    except ResolutionError:
        atomic_write(spec_path, text)
        notify(
            Note(
                "info", f"wrote {SPEC_FILENAME}, but no image fits it on this host; no lock written"
            )
        )
        raise
    row = resolution.row
    check_installable(spec, row.image, row.python, row.framework_version)
    atomic_write(spec_path, text)
    write_lock(lock_path, lock_from_resolution(resolution, matrix.version))
    ignored = ignore_own_files(directory)
    if ignored:
        notify(Note("info", f"added {', '.join(ignored)} to .gitignore (gpuenv's own files)"))
    return resolution


# What gpuenv writes in a project that is not the team's: the lock of gpuenv.lock (held
# while it is written), and .gpuenv/ (Slurm job scripts and their output).
OWN_FILES = (f".{LOCK_FILENAME}.lock", ".gpuenv/")


def ignore_own_files(directory: str) -> list[str]:
    """Add gpuenv's own files to the project's .gitignore, where the project is in git (a
    .gitignore there, or a .git at or above it): the lines it lacks, appended; never
    gpuenv.yaml or gpuenv.lock, which are committed. Returns the lines added."""
    path = os.path.join(directory, ".gitignore")
    if not os.path.isfile(path) and not _in_git(directory):
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError):
        return []  # a .gitignore gpuenv cannot read is left as it is
    present = {line.strip().lstrip("/") for line in text.splitlines()}
    missing = [name for name in OWN_FILES if name not in present]
    if missing:
        block = "# gpuenv's own files (commit gpuenv.yaml and gpuenv.lock, not these)\n"
        block += "".join(f"{name}\n" for name in missing)
        separator = "\n" if text and not text.endswith("\n") else ""
        atomic_write(path, text + separator + ("\n" if text else "") + block)
    return missing


def _in_git(directory: str) -> bool:
    folder = os.path.abspath(directory)
    while True:
        if os.path.exists(os.path.join(folder, ".git")):
            return True
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent


def _refuse_unread_pins(directory: str, overrides: Overrides, read_version: str | None) -> None:
    """A framework pinned only in a file gpuenv does not read (Pipfile, setup.cfg,
    pixi.toml) is refused with the fix (exit 3): locked on the newest image instead, the
    project would run another framework version than the one its team pinned. A version
    from the files gpuenv reads, or --version, decides; then nothing is refused."""
    if overrides.version or read_version:
        return
    pins = [
        pin
        for pin in unread_pins(directory)
        if overrides.framework is None or pin.framework == overrides.framework
    ]
    if not pins:
        return
    files = list(dict.fromkeys(pin.file for pin in pins))
    raise SpecError(
        [
            Problem(
                pin.file,
                pin.line,
                None,
                None,
                f"{pin} pins {FRAMEWORK_NAMES[pin.framework]}, but gpuenv does not read "
                f"{pin.file}: the lock would not follow it",
            )
            for pin in pins
        ],
        hint=f"write it where gpuenv reads it: {'; '.join(FIXES[f] for f in files)}; then "
        f"`gpuenv init` again (or pass the version: `gpuenv init --framework "
        f"{pins[0].framework} --version {_series(pins[0].specifier)}`)",
    )


def _series(specifier: str) -> str:
    return version_from_specifier(specifier) or specifier
