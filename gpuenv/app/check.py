"""`gpuenv check`: every file gpuenv reads for a project, validated, every problem kept;
and `gpuenv doctor`: whether this machine is ready for gpuenv (`check_machine`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuenv.containers.devcontainer import stale_devcontainer
from gpuenv.containers.doctor import Check, run_checks
from gpuenv.containers.preflight import preflight
from gpuenv.engine.protocol import Engine
from gpuenv.errors import (
    FileAccessError,
    GpuenvError,
    HostError,
    LockError,
    MatrixError,
    ResolutionError,
    SpecError,
    file_error,
)
from gpuenv.host.detect import detect_host
from gpuenv.host.hostfile import HOST_FILE_ENV, load_host_file
from gpuenv.host.machine import Host
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    Lock,
    check_locked_row,
    lock_differences,
    overlay_differences,
    read_lock,
    requirements_hashes,
)
from gpuenv.matrix.load import Matrix, load_matrix
from gpuenv.project.dependencies import needs_python, plan_install, read_dependencies
from gpuenv.project.mounts import check_mounts
from gpuenv.project.sources import Collected
from gpuenv.project.spec import SPEC_FILENAME, Spec
from gpuenv.project.validate import load_spec
from gpuenv.reservations.gpus import Grant


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
        spec, lock, host file, a lock the host cannot run), or 0."""
        order = (FileAccessError, MatrixError, SpecError, LockError, HostError, ResolutionError)
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


def check_project(
    directory: str, env: Mapping[str, str], detect: Callable[[], Host] = detect_host
) -> CheckReport:
    """`gpuenv check`: the matrices, gpuenv.yaml, gpuenv.lock and a host file, every
    problem collected; a valid lock is judged against the known host (`detect`). The
    lock and every dependency file are read once: the files' hashes (is the lock up to
    date?) and the install plan come from the same reading."""
    matrix, matrix_item = _matrix()
    existing, lock_error = _lock(directory)
    spec, collected, hashes, spec_item = _spec(directory, existing)
    items = [matrix_item, spec_item]
    if spec is not None and spec.mounts:
        items.append(_mounts_item(spec, env))
    if lock_error is not None:
        items.append(CheckItem(LOCK_FILENAME, error=lock_error))
    elif existing is not None:
        items.append(_lock_item(existing, spec, hashes, matrix))
        editor = stale_devcontainer(directory)
        if editor:
            hint = "run `gpuenv export devcontainer` again, then reopen (or rebuild) the container"
            items.append(CheckItem("devcontainer", error=LockError(editor, hint=hint)))
    if spec is not None and collected is not None and (spec.requirements or spec.packages):
        items.append(_dependencies_item(spec, existing, collected))
    host_ok = True
    if env.get(HOST_FILE_ENV):
        host_item = _host_file_item(env[HOST_FILE_ENV])
        host_ok = host_item.error is None
        items.append(host_item)
    lock_ok = all(i.error is None for i in items if i.subject == LOCK_FILENAME)
    if existing is not None and lock_ok and host_ok and matrix is not None:
        items.append(_runs_here_item(existing, matrix, detect()))
    return CheckReport(_no_tick_for_a_faulty_file(items))


def _no_tick_for_a_faulty_file(items: list[CheckItem]) -> tuple[CheckItem, ...]:
    """No ✓ for a file another item then reports a problem in (`✓ gpuenv.yaml: valid`,
    then the dependencies' error at gpuenv.yaml's `framework`): its line is dropped, the
    problem is what is said of it."""
    faulty = {
        problem.file
        for item in items
        if item.error is not None
        for problem in getattr(item.error, "problems", ())
    }
    return tuple(
        CheckItem(item.subject, None, item.error, item.warnings)
        if item.ok is not None and item.subject in faulty
        else item
        for item in items
    )


def _runs_here_item(lock: Lock, matrix: Matrix, host: Host) -> CheckItem:
    """Whether the known host (detected, or GPUENV_HOST_FILE's) can run the locked image:
    a lock another machine resolved may not run here."""
    if host.driver is None:
        why, fix = host.without_driver()
        if not host.source.startswith("file:"):
            fix = f"describe it in a host file and set {HOST_FILE_ENV} to check it here"
        return CheckItem(
            "host", warnings=(f"host: the lock was not checked against a host ({why}); {fix}",)
        )
    try:
        notes = preflight(lock.locked(""), host, Grant("all"), matrix)
    except ResolutionError as exc:
        error = ResolutionError(
            exc.message,
            exc.explanation,
            hint="the lock was resolved for another host: run it where it fits, or "
            "re-resolve for this host with `gpuenv lock --upgrade`",
        )
        return CheckItem("host", error=error)
    return CheckItem(
        "host", ok=f"host: {lock.image} runs on {host.describe()}", warnings=tuple(notes)
    )


def _matrix() -> tuple[Matrix | None, CheckItem]:
    try:
        matrix = load_matrix()
    except (MatrixError, FileAccessError) as exc:
        return None, CheckItem("matrix", error=exc)
    summary = f"matrix {matrix.version}: {len(matrix.images)} images, {len(matrix.gpus)} GPU models"
    return matrix, CheckItem("matrix", ok=summary)


def _lock(directory: str) -> tuple[Lock | None, GpuenvError | None]:
    try:
        return read_lock(os.path.join(directory, LOCK_FILENAME)), None
    except (LockError, FileAccessError) as exc:
        return None, exc
    except OSError as exc:
        return None, file_error(exc, "read")


def _spec(
    directory: str, lock: Lock | None
) -> tuple[Spec | None, Collected | None, dict[str, str], CheckItem]:
    """The spec, its dependency files read for the locked Python, and their hashes:
    "valid" promises the files the spec names can be read too (a requirements file you
    may not read fails here, not later)."""
    try:
        spec = load_spec(directory)
        collected = read_dependencies(spec, _locked_python(lock))
        hashes = requirements_hashes(spec, collected)
    except (SpecError, FileAccessError) as exc:
        return None, None, {}, CheckItem(SPEC_FILENAME, error=exc)
    except OSError as exc:
        return None, None, {}, CheckItem(SPEC_FILENAME, error=file_error(exc, "read"))
    ok = f"{SPEC_FILENAME}: valid ({spec.framework}, project {spec.name})"
    return spec, collected, hashes, CheckItem(SPEC_FILENAME, ok=ok)


def _mounts_item(spec: Spec, env: Mapping[str, str]) -> CheckItem:
    try:
        return CheckItem("mounts", ok=check_mounts(spec, env))
    except GpuenvError as exc:
        return CheckItem("mounts", error=exc)


def _lock_item(
    lock: Lock, spec: Spec | None, hashes: dict[str, str], matrix: Matrix | None
) -> CheckItem:
    """Whether the lock matches the spec (and its image the matrix); a lock is only
    read when the spec has problems."""
    try:
        changes = lock_differences(lock, spec, hashes) if spec is not None else []
        if changes:
            error = LockError(
                f"{LOCK_FILENAME} is out of date: " + "; ".join(changes), hint="run `gpuenv lock`"
            )
            return CheckItem(LOCK_FILENAME, error=error)
        if spec is not None and matrix is not None:
            check_locked_row(lock, spec, matrix)
    except (LockError, FileAccessError) as exc:
        return CheckItem(LOCK_FILENAME, error=exc)
    verdict = (
        "matches" if spec is not None else f"readable, not compared ({SPEC_FILENAME} has problems)"
    )
    stale = overlay_differences(lock, spec, hashes) if spec is not None else []
    count = len(lock.overlay.packages)
    packages = (
        f", {count} Python package{'s' if count != 1 else ''}" if lock.overlay.resolved else ""
    )
    warnings = tuple(
        f"{LOCK_FILENAME}: {line}"
        + ("" if "gpuenv lock" in line else ": `gpuenv lock` locks them again")
        + " (a build does it too)"
        for line in stale
    )
    return CheckItem(
        LOCK_FILENAME,
        ok=f"{LOCK_FILENAME}: {verdict} ({lock.pinned_image}{packages})",
        warnings=warnings,
    )


def _host_file_item(path: str) -> CheckItem:
    try:
        load_host_file(path)
    except (HostError, FileAccessError) as exc:
        return CheckItem(HOST_FILE_ENV, error=exc)
    return CheckItem(HOST_FILE_ENV, ok=f"{HOST_FILE_ENV}: valid")


def check_machine(directory: str, connect: Callable[[], Engine]) -> list[Check]:
    """`gpuenv doctor`: every check of this machine (and of the project's lock in
    `directory` against it), in the order they are shown. `connect` makes the engine;
    its failure is a check."""
    return run_checks(directory, connect)
