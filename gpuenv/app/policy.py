"""When and how gpuenv.lock changes: the rules behind `gpuenv lock`, `init` and `check`.

Pure policy over files: no terminal, no engine. Each function returns what happened
(with the notes a user should see), and the CLI shows it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from gpuenv.common.filelock import exclusive
from gpuenv.common.files import atomic_write
from gpuenv.errors import (
    FileAccessError,
    GpuenvError,
    HostError,
    LockError,
    MatrixError,
    ResolutionError,
    SpecError,
    UsageError,
    file_error,
)
from gpuenv.host.hostfile import HOST_FILE_ENV, load_host_file
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    Lock,
    check_locked_row,
    lock_differences,
    lock_from_resolution,
    locked_row_problems,
    read_lock,
    recorded_host,
    requirements_hashes,
    write_lock,
)
from gpuenv.matrix.load import Matrix, load_matrix
from gpuenv.project.dependencies import needs_python, plan_install, read_dependencies
from gpuenv.project.detect import detect_project, render_spec
from gpuenv.project.mounts import check_mounts
from gpuenv.project.overrides import Overrides, spec_for
from gpuenv.project.sources import Collected
from gpuenv.project.spec import SPEC_FILENAME, GpuRequest, Spec
from gpuenv.project.validate import load_spec, parse_spec_text
from gpuenv.resolution.hostplan import HostPlan
from gpuenv.resolution.pins import project_pins
from gpuenv.resolution.resolve import resolve
from gpuenv.resolution.verdicts import Resolution

NoteKind = Literal["info", "warn", "step"]


@dataclass(frozen=True)
class Note:
    kind: NoteKind
    text: str


Notify = Callable[[Note], None]


def _ignore(note: Note) -> None:
    del note


LockStatus = Literal["up-to-date", "written", "updated", "updated-same-image"]


@dataclass(frozen=True)
class LockUpdate:
    status: LockStatus
    pinned: str
    previous_image: str | None = None
    resolution: Resolution | None = None


def verify_lock(directory: str) -> Lock:
    """`gpuenv lock --check`: the lock, or LockError listing what changed."""
    spec = spec_for(directory, Overrides(), need_file=True)
    current = read_lock(os.path.join(directory, LOCK_FILENAME))
    changes = lock_differences(current, spec)
    if changes:
        raise LockError(
            f"{LOCK_FILENAME} is out of date:\n" + "\n".join(f"  - {c}" for c in changes),
            hint="run `gpuenv lock` and commit gpuenv.lock",
        )

    check_locked_row(current, spec, load_matrix())
    return current


def update_lock(
    directory: str, plan: HostPlan, *, upgrade: bool = False, notify: Notify = _ignore
) -> LockUpdate:
    """`gpuenv lock`: keep an up-to-date lock; on a change keep the locked image while it
    still fits (newest otherwise, always with `upgrade`); without a driver here, plan for
    the host the lock recorded. One writer at a time (LockHeld, exit 9, names another)."""
    with exclusive(os.path.join(directory, LOCK_FILENAME)):
        return _update_lock(directory, plan, upgrade=upgrade, notify=notify)


def _update_lock(directory: str, plan: HostPlan, *, upgrade: bool, notify: Notify) -> LockUpdate:
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

    resolution = resolve(spec, matrix, host, prefer=prefer, pins=project_pins(spec))
    same_image = existing is not None and existing.image == resolution.row.image
    digest = existing.digest if existing is not None and same_image else ""
    new_lock = lock_from_resolution(resolution, matrix.version, digest)
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


def init_project(
    directory: str,
    overrides: Overrides,
    plan: HostPlan,
    *,
    force: bool = False,
    notify: Notify = _ignore,
) -> Resolution:
    """`gpuenv init`: detect the project's pins, write gpuenv.yaml, resolve, write the
    lock. When no image fits, the spec is still written (to edit) and no lock is."""
    with exclusive(os.path.join(directory, LOCK_FILENAME)):
        return _init_project(directory, overrides, plan, force=force, notify=notify)


def _init_project(
    directory: str, overrides: Overrides, plan: HostPlan, *, force: bool, notify: Notify
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
    chosen_framework = overrides.framework or detected.framework
    if chosen_framework is None:
        chosen_framework = "pytorch"
        notify(
            Note(
                "info",
                "no framework found in requirements.txt, pyproject.toml or environment.yml; "
                "using pytorch",
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

    pins = project_pins(spec)
    try:
        resolution = resolve(spec, matrix, host, pins=pins)
    except ResolutionError:
        atomic_write(spec_path, text)
        notify(
            Note(
                "info", f"wrote {SPEC_FILENAME}, but no image fits it on this host; no lock written"
            )
        )
        raise
    atomic_write(spec_path, text)
    write_lock(lock_path, lock_from_resolution(resolution, matrix.version))
    return resolution


@dataclass(frozen=True)
class CheckItem:
    """One thing `gpuenv check` validated: a success line, or the error it found."""

    subject: str
    ok: str | None = None
    error: GpuenvError | None = None
    warnings: tuple[str, ...] = ()  # what will not be done as written (shown, not fatal)


@dataclass(frozen=True)
class CheckReport:
    items: tuple[CheckItem, ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> int:
        """The code of the first kind of problem (a file that cannot be read, matrix,
        spec, lock, host file), or 0."""
        order = (FileAccessError, MatrixError, SpecError, LockError, HostError)
        errors = [i.error for i in self.items if i.error is not None]
        if not errors:
            return 0
        first = min(
            errors, key=lambda e: next((i for i, k in enumerate(order) if isinstance(e, k)), 9)
        )
        return first.exit_code


def _locked_python(lock: Lock | None) -> str | None:
    """The Python of the locked image, which the dependencies' markers are read for."""
    python = lock.resolved.get("python") if lock is not None else None
    return python if isinstance(python, str) else None


def _dependencies_item(spec: Spec, lock: Lock | None, collected: Collected) -> CheckItem:
    """What the build will install, what it leaves to the image and what it will not do,
    for the locked image (or the spec alone without a lock)."""
    python = _locked_python(lock)
    version = lock.resolved.get("framework_version") if lock is not None else None
    try:
        plan = plan_install(
            collected, spec.framework, version if isinstance(version, str) else None, python
        )
        if lock is not None and not plan.empty:
            needs_python(spec, lock.image, python, spec.framework)
    except SpecError as exc:
        return CheckItem("dependencies", error=exc)
    summary = (
        f"dependencies: {len(collected.files)} file(s) read; {len(plan.install)} to install, "
        f"{len(plan.image)} left to the image, {len(plan.no_isolation)} without build isolation"
    )
    return CheckItem("dependencies", ok=summary, warnings=tuple(plan.notes()))


def check_project(directory: str, env: Mapping[str, str]) -> CheckReport:
    """`gpuenv check`: the matrices, gpuenv.yaml, gpuenv.lock and a host file, every
    problem collected. The lock and every dependency file are read once: the files'
    hashes (is the lock up to date?) and the install plan come from the same reading."""
    items: list[CheckItem] = []
    matrix: Matrix | None = None
    try:
        matrix = load_matrix()
        items.append(
            CheckItem(
                "matrix",
                ok=f"matrix {matrix.version}: {len(matrix.images)} images, "
                f"{len(matrix.gpus)} GPU models",
            )
        )
    except (MatrixError, FileAccessError) as exc:
        items.append(CheckItem("matrix", error=exc))
    existing: Lock | None = None
    lock_error: GpuenvError | None = None
    try:
        existing = read_lock(os.path.join(directory, LOCK_FILENAME))
    except (LockError, FileAccessError) as exc:
        lock_error = exc
    except OSError as exc:
        lock_error = file_error(exc, "read")
    spec = None
    collected = None
    hashes: dict[str, str] = {}
    try:
        spec = load_spec(directory)
        # "valid" promises the files the spec names can be read too (a requirements
        # file you may not read fails here, not later).
        collected = read_dependencies(spec, _locked_python(existing))
        hashes = requirements_hashes(spec, collected)
        items.append(
            CheckItem(
                SPEC_FILENAME, ok=f"{SPEC_FILENAME}: valid ({spec.framework}, project {spec.name})"
            )
        )
    except (SpecError, FileAccessError) as exc:
        spec = None
        items.append(CheckItem(SPEC_FILENAME, error=exc))
    except OSError as exc:
        spec = None
        items.append(CheckItem(SPEC_FILENAME, error=file_error(exc, "read")))
    if spec is not None and spec.mounts:
        try:
            items.append(CheckItem("mounts", ok=check_mounts(spec, env)))
        except GpuenvError as exc:
            items.append(CheckItem("mounts", error=exc))
    if lock_error is not None:
        items.append(CheckItem(LOCK_FILENAME, error=lock_error))
    elif existing is not None:
        try:
            changes = lock_differences(existing, spec, hashes) if spec else []
            if changes:
                error = LockError(
                    f"{LOCK_FILENAME} is out of date: " + "; ".join(changes),
                    hint="run `gpuenv lock`",
                )
                items.append(CheckItem(LOCK_FILENAME, error=error))
            else:
                if spec is not None and matrix is not None:
                    check_locked_row(existing, spec, matrix)
                verdict = (
                    "matches"
                    if spec is not None
                    else f"readable, not compared ({SPEC_FILENAME} has problems)"
                )
                items.append(
                    CheckItem(
                        LOCK_FILENAME, ok=f"{LOCK_FILENAME}: {verdict} ({existing.pinned_image})"
                    )
                )
        except (LockError, FileAccessError) as exc:
            items.append(CheckItem(LOCK_FILENAME, error=exc))
    if spec is not None and collected is not None and (spec.requirements or spec.packages):
        items.append(_dependencies_item(spec, existing, collected))
    host_file = env.get(HOST_FILE_ENV)
    if host_file:
        try:
            load_host_file(host_file)
            items.append(CheckItem(HOST_FILE_ENV, ok=f"{HOST_FILE_ENV}: valid"))
        except (HostError, FileAccessError) as exc:
            items.append(CheckItem(HOST_FILE_ENV, error=exc))
    return CheckReport(tuple(items))
