"""gpuenv init, lock, check: the spec and the lock."""

from __future__ import annotations

import os
import sys

import click

from gpuenv.app.check import check_project
from gpuenv.app.init import init_project
from gpuenv.app.lock import LockUpdate, Note
from gpuenv.app.locking import LockRequest, Steps, lock_project
from gpuenv.cli import output, ui
from gpuenv.cli.base import view_factory
from gpuenv.cli.context import Application, host_options, json_option, report, spec_options
from gpuenv.cli.failure import error_fields
from gpuenv.cli.views import show_resolution
from gpuenv.project.overrides import Overrides
from gpuenv.resolution.hostplan import HostPlan

LOCK = "gpuenv.lock"  # as the messages name it


def _notify(note: object) -> None:
    assert isinstance(note, Note)
    {"info": ui.info, "warn": ui.warn, "step": ui.step}[note.kind](note.text)


def _lock_data(
    status: str,
    image: str,
    path: str,
    *,
    previous: str | None = None,
    resolution: dict[str, object] | None = None,
    packages: dict[str, object] | None = None,
) -> dict[str, object]:
    """`lock --json` (gpuenv/schemas/lock.json)."""
    extra = {"packages": packages} if packages is not None else {}
    return {
        **extra,
        "ok": True,
        "exit_code": 0,
        "status": status,
        "image": image,
        "previous_image": previous,
        "lock": path,
        "resolution": resolution,
    }


@click.command()
@host_options
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Only verify that gpuenv.lock matches gpuenv.yaml and its requirements "
    "(for CI); write nothing.",
)
@click.option(
    "--upgrade",
    is_flag=True,
    help="Re-resolve to the newest image that fits, even if the locked one still does.",
)
@click.option(
    "--newest",
    is_flag=True,
    help="With --upgrade's re-resolve, take the newest image that fits even where the "
    "matrix does not record its framework version or its forward compatibility is disputed.",
)
@click.option(
    "--upgrade-package",
    "upgrade_packages",
    multiple=True,
    metavar="NAME",
    help="Move one locked Python package (and what must move with it) to the newest "
    "version the requirements allow; the others keep their versions. Repeatable.",
)
@click.option(
    "--exclude-newer",
    metavar="DATE",
    help="Resolve the Python packages as of DATE (2026-01-31, or 2026-01-31T08:30:00Z in "
    "UTC): only files the indexes say were uploaded before it (pip's --uploaded-prior-to; "
    "the index must give upload times, as PyPI does). Kept in the lock for later re-locks.",
)
@json_option("what happened to the lock")
@click.pass_obj
def lock(
    obj: Application,
    driver: str | None,
    gpu_models: tuple[str, ...],
    platform: str | None,
    check_only: bool,
    upgrade: bool,
    newest: bool,
    upgrade_packages: tuple[str, ...],
    exclude_newer: str | None,
    as_json: bool,
) -> None:
    """Resolve gpuenv.yaml and pin the result in gpuenv.lock.

    The lock pins the image, and every Python package a build installs on it (exact
    version, the sha256 of its file, its index).

    With an up-to-date lock this does nothing. When gpuenv.yaml or a requirements
    file changed, the locked image is kept if it still fits, and replaced by the
    newest that fits otherwise (among images whose framework version the matrix
    records; --newest takes any, and implies --upgrade). --upgrade always takes the
    newest.

    The Python packages are resolved inside the pinned base image (pulled if missing),
    against what it has installed and its pip constraint files, so a container engine
    is needed; without one the lock says they are not resolved yet, and the first build
    resolves them. A re-lock keeps every locked version the change does not force to
    move and prints what changed; --upgrade moves them all, --upgrade-package one, and
    --exclude-newer DATE resolves them as of a date (to rebuild last year's environment).

    A base image of your own (`base: REGISTRY/PATH:TAG`) is pulled and read from the
    image itself (its environment, and a probe of its Python and framework); the lock
    keeps what was read, and --upgrade reads it again (its tag may have moved).

    --check fails (exit 5) when the lock is missing or out of date, or its Python
    packages are not locked for the requirements as they are, and lists what changed.
    """

    def image_locked(update: LockUpdate) -> None:
        if update.resolution is None:
            ui.success(f"{LOCK} is up to date ({update.pinned})")
            return
        image = update.resolution.row.image
        if not as_json:
            output.result(image)
        if update.status == "written":
            ui.success(f"wrote {LOCK}")
        elif update.status == "updated-same-image":
            ui.success(f"updated {LOCK}; the image is unchanged")
        else:
            ui.success(f"updated {LOCK}: {update.previous_image} → {image}")
        show_resolution(update.resolution)

    request = LockRequest(
        HostPlan(driver, gpu_models, platform),
        check_only=check_only,
        upgrade=upgrade,
        newest=newest,
        upgrade_packages=upgrade_packages,
        exclude_newer=exclude_newer,
    )
    steps = Steps(_notify, image_locked, ui.info, obj.engine, view_factory(as_json))
    outcome = lock_project(obj.directory, request, steps)
    if outcome.checked is not None:
        if as_json:
            output.data(_lock_data("up-to-date", outcome.checked, outcome.path))
        ui.success(f"{LOCK} is up to date ({outcome.checked})")
        return
    update, packages = outcome.update, outcome.packages
    assert update is not None and packages is not None
    if packages.said is not None:
        (ui.info if packages.resolved else ui.warn)(packages.said)
    else:
        first, *rest = packages.summary
        ui.success(first)
        for line in rest:
            ui.info(line)
    if as_json:
        output.data(
            _lock_data(
                update.status,
                update.pinned,
                outcome.path,
                previous=update.previous_image,
                resolution=update.resolution.to_data() if update.resolution else None,
                packages=packages.to_data(),
            )
        )


@click.command()
@spec_options
@host_options
@click.option("--force", is_flag=True, help="Overwrite an existing gpuenv.yaml and gpuenv.lock.")
@click.option(
    "--strict-driver",
    is_flag=True,
    help="Write `strict_driver: true`: only images the host's driver runs natively.",
)
@click.option(
    "--newest",
    is_flag=True,
    help="Lock the newest image that fits, even where the matrix does not record its "
    "framework version or its forward compatibility is disputed.",
)
@json_option("what was found and written")
@click.pass_obj
def init(
    obj: Application,
    framework: str | None,
    version: str | None,
    python: str | None,
    cuda: str | None,
    driver: str | None,
    gpu_models: tuple[str, ...],
    platform: str | None,
    force: bool,
    strict_driver: bool,
    newest: bool,
    as_json: bool,
) -> None:
    """Write gpuenv.yaml and gpuenv.lock for the project in this folder.

    Reads the project's dependency sources (requirements.txt with its includes, or a
    requirements/ folder's base.txt; pyproject.toml with uv.lock; environment.yml) and
    names them in `requirements:`; what it finds and does not read (Pipfile, setup.cfg,
    pixi.toml, other requirements files, optional groups, Poetry sources) is named with
    what to do, and a framework pinned only there is refused (exit 3) with the fix.
    The framework is what they need (torch==2.3.1 → pytorch "2.3"; a [build-system]
    pin; tf-keras → tensorflow; torchvision==0.16.0 → torch 2.1 by its metadata);
    several frameworks fail and ask for --framework. Python from .python-version,
    else conda's python=, else requires-python, else Poetry's python; the host's
    driver and GPUs. Shows what it found and where. Flags win over what is
    detected. Never asks questions; refuses to overwrite without --force.
    """
    notes: list[Note] = []

    def notify(note: object) -> None:
        assert isinstance(note, Note)
        notes.append(note)
        _notify(note)

    written = init_project(
        obj.directory,
        Overrides(framework, version, python, cuda),
        HostPlan(driver, gpu_models, platform),
        force=force,
        strict_driver=strict_driver,
        newest=newest,
        notify=notify,
    )
    resolution = written.resolution
    if as_json:
        output.data(
            {
                "ok": True,
                "exit_code": 0,
                "image": resolution.row.image,
                "spec": written.spec,
                "lock": written.lock,
                "notes": [{"kind": n.kind, "text": n.text} for n in notes],
                "resolution": resolution.to_data(),
            }
        )
    else:
        output.result(resolution.row.image)
    ui.success(f"wrote gpuenv.yaml and {LOCK}")
    show_resolution(resolution)
    if resolution.spec.requirements or resolution.spec.packages:
        ui.info(
            "next: review gpuenv.yaml, then `gpuenv lock` to lock the Python packages in the "
            "base image (it needs a container engine; else the first `gpuenv build` does it "
            "and writes the lock), and commit gpuenv.yaml and gpuenv.lock"
        )
    else:
        ui.info("next: review gpuenv.yaml, then commit gpuenv.yaml and gpuenv.lock")


@click.command()
@json_option("every item checked, and the first error")
@click.pass_obj
def check(obj: Application, as_json: bool) -> None:
    """Validate the matrices, gpuenv.yaml, gpuenv.lock and the dependency sources,
    reporting every problem, and what the build will leave to the image. A valid
    lock is judged against the known host (this machine's NVML, or GPUENV_HOST_FILE):
    one this host cannot run fails; with no host known, a warning says it was not
    checked.

    Exits with the code of the first kind of problem found (8 a file that cannot be
    read, 6 matrix, 3 spec, 5 lock, 7 host file, 4 a lock this host cannot run), 0
    when all is well.
    """
    outcome = check_project(obj.directory, os.environ)
    if as_json:
        errors = [item.error for item in outcome.items if item.error is not None]
        first = next((e for e in errors if e.exit_code == outcome.exit_code), None)
        output.data(
            {
                "ok": outcome.exit_code == 0,
                "exit_code": outcome.exit_code,
                "items": [
                    {
                        "subject": item.subject,
                        "ok": item.error is None,
                        "message": (
                            item.error.message
                            if item.error is not None
                            else item.ok or "; ".join(item.warnings)  # not checked: why
                        ),
                        "error": error_fields(item.error) if item.error is not None else None,
                        "warnings": list(item.warnings),
                    }
                    for item in outcome.items
                ],
                "error": error_fields(first) if first is not None else None,
            }
        )
    for item in outcome.items:
        if item.error is not None:
            report(item.error)
        elif item.ok:
            ui.success(item.ok)
        for warning in item.warnings:
            ui.warn(warning)
    if outcome.exit_code:
        sys.exit(outcome.exit_code)
