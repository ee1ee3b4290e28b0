"""The `gpuenv` command: parse, call one core function, show the result.

Kept thin and light: heavy modules (rich, docker, the core) are imported inside the
commands, so `gpuenv --version` and `--help` start fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import click

from gpuenv import __version__
from gpuenv.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, GpuenvError, exit_codes_help

if TYPE_CHECKING:
    from gpuenv.project.spec import Spec
    from gpuenv.resolution.host import Host
    from gpuenv.resolution.matrix import Matrix
    from gpuenv.resolution.resolve import Resolution

F = TypeVar("F", bound=Callable[..., Any])

FRAMEWORK_CHOICE = click.Choice(["pytorch", "tensorflow", "jax", "none"])


class Context(NamedTuple):
    directory: str
    debug: bool


def _traceback() -> None:
    import traceback

    traceback.print_exc()


def _report(exc: GpuenvError) -> None:
    from gpuenv.cli import ui
    from gpuenv.errors import BuildError, ResolutionError

    ui.error(exc.message)
    if isinstance(exc, ResolutionError):
        for line in exc.explanation:
            ui.detail(line)
    if isinstance(exc, BuildError) and exc.output:
        ui.info("last lines of its output:")
        for line in exc.output:
            ui.detail(line)
    if exc.hint:
        from rich.markup import escape

        ui.err.print(f"[cyan]hint:[/] {escape(exc.hint)}")


class GpuenvGroup(click.Group):
    """Turns gpuenv errors into one message and an exit code; tracebacks only with --debug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpuenvError as exc:
            _report(exc)
            if _debug(ctx):
                _traceback()
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
            raise
        except Exception as exc:
            if _debug(ctx):
                _traceback()
            click.echo(
                f"error: internal error: {type(exc).__name__}: {exc}\n"
                "hint: this is a bug in gpuenv; run again with --debug and report the traceback",
                err=True,
            )
            ctx.exit(EXIT_INTERNAL)


def _debug(ctx: click.Context) -> bool:
    obj = ctx.find_object(Context)
    return bool(obj and obj.debug) or os.environ.get("GPUENV_DEBUG") == "1"


@click.group(
    cls=GpuenvGroup,
    epilog=exit_codes_help(),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", "-V", prog_name="gpuenv")
@click.option(
    "-C",
    "--directory",
    type=click.Path(file_okay=False, exists=True),
    default=".",
    help="Run as if gpuenv was started in this project folder.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (for bug reports).")
@click.pass_context
def main(ctx: click.Context, directory: str, debug: bool) -> None:
    """gpuenv: one spec per project for GPU containers.

    gpuenv.yaml says what the project needs; gpuenv resolves it against NVIDIA's NGC
    images, the CUDA/driver rules and this host's GPUs, and pins the answer in
    gpuenv.lock for everyone on the team.

    \b
    Start:   gpuenv init            write gpuenv.yaml and gpuenv.lock
    Plan:    gpuenv resolve --explain
    Pin:     gpuenv lock            (--check in CI, --upgrade to move on)
    Image:   gpuenv build           (pulls the base, pins its digest, builds)
    Run:     gpuenv run train.py    (as you, the project at /workspace)
    Share:   gpuenv ps | top | stop (who uses which GPU)
    Scale:   gpuenv push | submit | jobs | export kubernetes|compose
    Fix:     gpuenv doctor
    Check:   gpuenv check
    Data:    gpuenv matrix pytorch
    """
    ctx.obj = Context(directory=os.path.abspath(directory), debug=debug)


def host_options(func: F) -> F:
    """--driver / --gpu: plan for a described host instead of this machine."""
    func = click.option(
        "--gpu",
        "gpu_models",
        multiple=True,
        metavar="MODEL",
        help="Plan for a host with this GPU (repeat per GPU), e.g. 'A100' or 'RTX 4090'.",
    )(func)
    func = click.option(
        "--driver",
        metavar="VERSION",
        help="Plan for a host with this NVIDIA driver, e.g. 535.104.05.",
    )(func)
    return func


def spec_options(func: F) -> F:
    """--framework / --version / --python / --cuda: override the spec's fields."""
    for name, help_text in (
        ("--cuda", "CUDA toolkit constraint, e.g. '>=12.4' or '12.4'."),
        ("--python", "Python constraint, e.g. '3.10' (3.10.*) or '>=3.10'."),
        ("--version", "Framework version constraint (PEP 440), e.g. '2.4' or '>=2.1,<2.5'."),
    ):
        func = click.option(name, metavar="SPEC", help=help_text)(func)
    func = click.option("--framework", type=FRAMEWORK_CHOICE, help="Framework to resolve.")(func)
    return func


class Overrides(NamedTuple):
    framework: str | None = None
    version: str | None = None
    python: str | None = None
    cuda: str | None = None


def _checked_overrides(
    framework: str | None, version: str | None, python: str | None, cuda: str | None
) -> Overrides:
    from gpuenv.common.versions import InvalidConstraint, parse_constraint
    from gpuenv.errors import UsageError

    for flag, value in (("--version", version), ("--python", python), ("--cuda", cuda)):
        if value is not None:
            try:
                parse_constraint(value)
            except InvalidConstraint as exc:
                raise UsageError(f"{flag}: {exc}") from None
    return Overrides(
        framework, version and version.strip(), python and python.strip(), cuda and cuda.strip()
    )


def _spec(directory: str, overrides: Overrides, *, need_file: bool = False) -> Spec:
    from gpuenv.errors import UsageError
    from gpuenv.project.spec import SPEC_FILENAME, default_spec, display_path, load_spec

    if os.path.exists(os.path.join(directory, SPEC_FILENAME)) or need_file:
        spec = load_spec(directory)
    elif overrides.framework:
        spec = default_spec(directory, overrides.framework)
    else:
        raise UsageError(
            f"no {SPEC_FILENAME} in {display_path(directory) or '.'}",
            hint="run `gpuenv init` to write one, or give --framework "
            "(with --version, --python, --cuda) to resolve without a spec",
        )
    return spec.with_overrides(
        framework=overrides.framework,
        version=overrides.version,
        python=overrides.python,
        cuda=overrides.cuda,
    )


def _host(driver: str | None, gpu_models: tuple[str, ...], matrix: Matrix) -> Host:
    from gpuenv.resolution.host import HostOverride, host_for

    return host_for(HostOverride(driver, gpu_models), matrix)


def _show_resolution(resolution: Resolution) -> None:
    from gpuenv.cli import ui

    row = resolution.row
    parts = [
        f"{row.label.split()[0]} {row.framework_version or '(version not recorded)'}"
        if row.framework != "none"
        else None,
        f"CUDA {row.cuda}" if row.cuda else None,
        f"cuDNN {row.cudnn}" if row.cudnn else None,
        f"Python {row.python}" if row.python else None,
        f"Ubuntu {row.ubuntu}" if row.ubuntu else None,
    ]
    ui.detail(" · ".join(p for p in parts if p))
    requires = f"needs driver ≥ {resolution.candidate.min_driver or 'unknown'}"
    if row.min_compute_capability:
        requires += f", compute capability ≥ {row.min_compute_capability}"
    ui.detail(f"{requires}; host: {resolution.candidate.driver_route}")
    ui.detail(f"evidence: {row.evidence} ({row.source})")
    for warning in resolution.warnings:
        ui.warn(warning)


def _explain_table(candidates: Any, chosen: Any | None, host: Host) -> None:
    from rich.table import Table

    from gpuenv.cli import ui

    table = Table(title=f"Candidates for {host.describe()}", title_justify="left", expand=False)
    for column in ("", "image", "version", "CUDA", "Python", "driver ≥", "why"):
        table.add_column(column, overflow="fold")
    for candidate in candidates:
        row = candidate.row
        if candidate is chosen:
            mark, why = "[green]✓[/]", "[green]chosen: newest that fits[/]"
        elif candidate.ok:
            mark, why = "[green]✓[/]", "fits (older)"
        else:
            mark = "[red]✗[/]"
            from rich.markup import escape

            why = escape("; ".join(r.reason for r in candidate.rejections))
        table.add_row(
            mark,
            row.tag,
            row.framework_version or "?",
            row.cuda or "?",
            row.python or "?",
            candidate.min_driver or "?",
            why,
        )
    ui.out.print(table)


@main.command()
@spec_options
@host_options
@click.option("--explain", is_flag=True, help="Show every candidate image and why it fits or not.")
@click.option("--json", "as_json", is_flag=True, help="Print the resolution as one JSON object.")
@click.pass_obj
def resolve(
    obj: Context,
    framework: str | None,
    version: str | None,
    python: str | None,
    cuda: str | None,
    driver: str | None,
    gpu_models: tuple[str, ...],
    explain: bool,
    as_json: bool,
) -> None:
    """Choose the image for the spec on this host (or a described one).

    Uses gpuenv.yaml when present; flags override its fields, and with --framework
    no spec file is needed. Prints the image reference; details go to stderr.
    Nothing is written: `gpuenv lock` pins the result.

    \b
    Examples:
      gpuenv resolve --explain
      gpuenv resolve --framework pytorch --version 2.4 --driver 535.104.05 --gpu 'RTX 4090'
      gpuenv resolve --json | jq -r .image
    """
    from gpuenv.cli import ui
    from gpuenv.errors import ResolutionError
    from gpuenv.resolution.matrix import load_matrix
    from gpuenv.resolution.resolve import resolve as do_resolve

    overrides = _checked_overrides(framework, version, python, cuda)
    spec = _spec(obj.directory, overrides)
    matrix = load_matrix()
    host = _host(driver, gpu_models, matrix)
    try:
        resolution = do_resolve(spec, matrix, host)
    except ResolutionError as exc:
        if explain:
            _explain_table(exc.candidates, None, host)
        raise exc from None
    if as_json:
        payload = resolution.to_data()
        payload["matrix_version"] = matrix.version
        ui.data(payload)
        for warning in resolution.warnings:
            ui.warn(warning)
        return
    if explain:
        _explain_table(resolution.candidates, resolution.candidate, host)
    ui.result(resolution.row.image)
    _show_resolution(resolution)


@main.command()
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
@click.pass_obj
def lock(
    obj: Context,
    driver: str | None,
    gpu_models: tuple[str, ...],
    check_only: bool,
    upgrade: bool,
) -> None:
    """Resolve gpuenv.yaml and pin the result in gpuenv.lock.

    With an up-to-date lock this does nothing. When gpuenv.yaml or a requirements
    file changed, the locked image is kept if it still fits, and replaced by the
    newest that fits otherwise. --upgrade always takes the newest. --check fails
    (exit 5) when the lock is missing or out of date, and lists what changed.
    """
    from dataclasses import replace

    from gpuenv.cli import ui
    from gpuenv.errors import LockError, UsageError
    from gpuenv.resolution.lock import (
        LOCK_FILENAME,
        Lock,
        lock_differences,
        lock_from_resolution,
        read_lock,
        recorded_host,
        write_lock,
    )
    from gpuenv.resolution.matrix import load_matrix
    from gpuenv.resolution.resolve import resolve as do_resolve

    if check_only and upgrade:
        raise UsageError("--check and --upgrade cannot be combined: --check writes nothing")
    spec = _spec(obj.directory, Overrides(), need_file=True)
    path = os.path.join(obj.directory, LOCK_FILENAME)
    if check_only:
        current = read_lock(path)
        changes = lock_differences(current, spec)
        if changes:
            raise LockError(
                f"{LOCK_FILENAME} is out of date:\n" + "\n".join(f"  - {c}" for c in changes),
                hint="run `gpuenv lock` and commit gpuenv.lock",
            )
        ui.success(f"{LOCK_FILENAME} is up to date ({current.pinned_image})")
        return
    existing: Lock | None = None
    if os.path.exists(path):
        try:
            existing = read_lock(path)
        except LockError as exc:
            ui.warn(f"{exc.message}; writing a new lock")
    host_given = driver is not None or bool(gpu_models)
    if (
        existing is not None
        and not upgrade
        and not host_given
        and not lock_differences(existing, spec)
    ):
        ui.success(f"{LOCK_FILENAME} is up to date ({existing.pinned_image})")
        return
    matrix = load_matrix()
    host = _host(driver, gpu_models, matrix)
    if host.driver is None and existing is not None and not host_given:
        recorded = recorded_host(existing)
        if recorded is not None:
            host = recorded
            ui.info(f"no NVIDIA driver here: planning for the host in the lock: {host.describe()}")
    prefer = existing.image if existing is not None and not upgrade else None
    resolution = do_resolve(spec, matrix, host, prefer=prefer)
    same_image = existing is not None and existing.image == resolution.row.image
    digest = existing.digest if existing is not None and same_image else ""
    new_lock = lock_from_resolution(resolution, matrix.version, digest)
    if existing is not None and same_image and not lock_differences(existing, spec):
        # Same spec, same image (a re-resolve for another host): the pushed image holds.
        new_lock = replace(new_lock, extra=existing.extra)
    write_lock(path, new_lock)
    ui.result(resolution.row.image)
    if existing is None:
        ui.success(f"wrote {LOCK_FILENAME}")
    elif same_image:
        ui.success(f"updated {LOCK_FILENAME}; the image is unchanged")
    else:
        ui.success(f"updated {LOCK_FILENAME}: {existing.image} → {resolution.row.image}")
    _show_resolution(resolution)


@main.command()
@spec_options
@host_options
@click.option("--force", is_flag=True, help="Overwrite an existing gpuenv.yaml and gpuenv.lock.")
@click.pass_obj
def init(
    obj: Context,
    framework: str | None,
    version: str | None,
    python: str | None,
    cuda: str | None,
    driver: str | None,
    gpu_models: tuple[str, ...],
    force: bool,
) -> None:
    """Write gpuenv.yaml and gpuenv.lock for the project in this folder.

    Detects the framework and its version from requirements*.txt, pyproject.toml or
    environment.yml pins (torch==2.3.1 → pytorch "2.3"), the Python version from
    .python-version or requires-python, and the host's driver and GPUs. Flags win
    over what is detected. Never asks questions; refuses to overwrite without --force.
    """
    from gpuenv.cli import ui
    from gpuenv.common.files import atomic_write
    from gpuenv.errors import ResolutionError, UsageError
    from gpuenv.project.detect import detect_project, render_spec
    from gpuenv.project.spec import SPEC_FILENAME, GpuRequest, parse_spec_text
    from gpuenv.resolution.lock import LOCK_FILENAME, lock_from_resolution, write_lock
    from gpuenv.resolution.matrix import load_matrix
    from gpuenv.resolution.resolve import resolve as do_resolve

    overrides = _checked_overrides(framework, version, python, cuda)
    spec_path = os.path.join(obj.directory, SPEC_FILENAME)
    lock_path = os.path.join(obj.directory, LOCK_FILENAME)
    existing = [p for p in (spec_path, lock_path) if os.path.exists(p)]
    if existing and not force:
        names = " and ".join(os.path.basename(p) for p in existing)
        raise UsageError(
            f"{names} already exist{'s' if len(existing) == 1 else ''} in {obj.directory}",
            hint="edit gpuenv.yaml and run `gpuenv lock`, "
            "or use `gpuenv init --force` to start over",
        )
    matrix = load_matrix()
    host = _host(driver, gpu_models, matrix)
    detected = detect_project(obj.directory)
    chosen_framework = overrides.framework or detected.framework
    if chosen_framework is None:
        chosen_framework = "pytorch"
        ui.info(
            "no framework pinned in requirements*.txt, pyproject.toml or environment.yml; "
            "using pytorch"
        )
    same_framework = chosen_framework == detected.framework
    text = render_spec(
        obj.directory,
        detected,
        framework=chosen_framework,
        version=overrides.version or (detected.version if same_framework else None),
        python=overrides.python or detected.python,
        cuda=overrides.cuda,
        gpus=GpuRequest("all"),
    )
    spec = parse_spec_text(text, obj.directory)
    for found in detected.found:
        ui.step(f"found {found}")
    if detected.also:
        ui.warn(f"also found {', '.join(detected.also)}; gpuenv.yaml uses {chosen_framework}")
    try:
        resolution = do_resolve(spec, matrix, host)
    except ResolutionError:
        atomic_write(spec_path, text)
        ui.info(f"wrote {SPEC_FILENAME}, but no image fits it on this host; no lock written")
        raise
    atomic_write(spec_path, text)
    write_lock(lock_path, lock_from_resolution(resolution, matrix.version))
    ui.result(resolution.row.image)
    ui.success(f"wrote {SPEC_FILENAME} and {LOCK_FILENAME}")
    _show_resolution(resolution)
    ui.info("next: review gpuenv.yaml, then commit gpuenv.yaml and gpuenv.lock")


@main.command()
@click.pass_obj
def check(obj: Context) -> None:
    """Validate the matrices, gpuenv.yaml and gpuenv.lock, reporting every problem.

    Exits with the code of the first kind of problem found (6 matrix, 3 spec,
    5 lock, 7 host file), 0 when all is well.
    """
    from gpuenv.cli import ui
    from gpuenv.errors import HostError, LockError, MatrixError, SpecError
    from gpuenv.project.spec import SPEC_FILENAME, load_spec
    from gpuenv.resolution.host import HOST_FILE_ENV, load_host_file
    from gpuenv.resolution.lock import LOCK_FILENAME, lock_differences, read_lock
    from gpuenv.resolution.matrix import load_matrix

    failures: list[GpuenvError] = []

    def failed(exc: GpuenvError) -> None:
        failures.append(exc)
        _report(exc)

    try:
        matrix = load_matrix()
        ui.success(
            f"matrix {matrix.version}: {len(matrix.images)} images, {len(matrix.gpus)} GPU models"
        )
    except MatrixError as exc:
        failed(exc)
    spec = None
    try:
        spec = load_spec(obj.directory)
        ui.success(f"{SPEC_FILENAME}: valid ({spec.framework}, project {spec.name})")
    except SpecError as exc:
        failed(exc)
    lock_path = os.path.join(obj.directory, LOCK_FILENAME)
    try:
        existing = read_lock(lock_path)
        changes = lock_differences(existing, spec) if spec else []
        if changes:
            failed(
                LockError(
                    f"{LOCK_FILENAME} is out of date: " + "; ".join(changes),
                    hint="run `gpuenv lock`",
                )
            )
        else:
            ui.success(f"{LOCK_FILENAME}: matches ({existing.pinned_image})")
    except LockError as exc:
        failed(exc)
    host_file = os.environ.get(HOST_FILE_ENV)
    if host_file:
        try:
            load_host_file(host_file)
            ui.success(f"{HOST_FILE_ENV}: valid")
        except HostError as exc:
            failed(exc)
    if failures:
        order = (MatrixError, SpecError, LockError, HostError)
        first = min(
            failures, key=lambda e: next((i for i, k in enumerate(order) if isinstance(e, k)), 9)
        )
        sys.exit(first.exit_code)


@main.command()
@click.argument(
    "table",
    required=False,
    type=click.Choice(["pytorch", "tensorflow", "jax", "none", "cuda", "gpus"]),
)
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
def matrix(table: str | None, as_json: bool) -> None:
    """Show the compatibility matrix gpuenv resolves against.

    \b
    gpuenv matrix             what the matrix holds
    gpuenv matrix pytorch     NGC PyTorch images (also tensorflow, jax, none)
    gpuenv matrix cuda        CUDA toolkits, driver floors, compute capabilities
    gpuenv matrix gpus        GPU models, compute capability and class
    """
    from gpuenv.cli.matrix_view import show_matrix
    from gpuenv.resolution.matrix import load_matrix

    show_matrix(load_matrix(), table, as_json)


def _mirror() -> str | None:
    from gpuenv.errors import UsageError
    from gpuenv.images.registry import InvalidMirror, registry_mirror

    try:
        return registry_mirror()[0]
    except InvalidMirror as exc:
        raise UsageError(str(exc)) from None


def _engine() -> Any:
    from gpuenv.engine.dockerpy import DockerEngine

    return DockerEngine()


quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress output, only errors.")
bake_option = click.option(
    "--bake",
    is_flag=True,
    help="Copy the project into the image (/workspace), for images that travel to a cluster.",
)


@main.command()
@bake_option
@click.pass_obj
def render(obj: Context, bake: bool) -> None:
    """Print the Dockerfile `gpuenv build` would build; builds nothing.

    The base is pinned by digest once `gpuenv pull` (or `gpuenv build`) has recorded it
    in gpuenv.lock; with a registry mirror, FROM names the mirror.
    """
    from gpuenv.images.service import load_project, plan

    project = load_project(obj.directory)
    click.echo(plan(project, _mirror(), bake=bake).dockerfile, nl=False)


@main.command()
@quiet_option
@click.pass_obj
def pull(obj: Context, quiet: bool) -> None:
    """Pull the locked base image and pin its digest in gpuenv.lock.

    Uses the digest once the lock has one, so a moved tag never changes what you get.
    NGC_API_KEY (for nvcr.io) and Docker's stored credentials are used; with
    GPUENV_REGISTRY_MIRROR=host:port (or registry_mirror in the user config file)
    nvcr.io images are pulled from the mirror, and the lock keeps the canonical name.
    """
    from gpuenv.cli import ui
    from gpuenv.cli.live import make_view
    from gpuenv.images.service import ensure_base, load_project

    project = load_project(obj.directory)
    had_digest = bool(project.lock.digest)
    project, local = ensure_base(project, _engine(), make_view(quiet), _mirror())
    ui.result(local)
    if had_digest:
        ui.success(f"{project.lock.image} is present (pinned at {project.lock.digest})")
    else:
        ui.success(f"pinned {project.lock.image} at {project.lock.digest} in gpuenv.lock")


@main.command()
@bake_option
@quiet_option
@click.pass_obj
def build(obj: Context, bake: bool, quiet: bool) -> None:
    """Build the project image: the locked base (pulled and pinned first if needed), apt
    packages, requirements, extra packages.

    The tag is a hash of the base digest, the Dockerfile and the files copied in
    (gpuenv/<name>:<hash>): when nothing changed, the image is found and nothing is
    built. Project code is mounted at run time, not copied, unless --bake.
    """
    from gpuenv.engine.api import image_exists_fast
    from gpuenv.project import stamp

    def up_to_date(tag: str) -> None:
        click.echo(tag)
        if not quiet:
            click.echo("✓ up to date: nothing to build", err=True)

    # The no-op path: nothing changed since the last build, and the engine has the image.
    known = stamp.fresh_tag(obj.directory, bake)
    if known and image_exists_fast(known):
        up_to_date(known)
        return

    from gpuenv.cli import ui

    _, tag, result = _build_project(obj, bake, quiet)
    if result is None:
        up_to_date(tag)
        return
    ui.result(tag)
    if not quiet:
        if result.built:
            ui.success(
                f"built {result.tag} in {result.seconds:.1f}s "
                f"({result.cached_steps} "
                f"{'step' if result.cached_steps == 1 else 'steps'} from cache)"
            )
        else:
            ui.success("up to date: nothing to build")


def _age(created: int) -> str:
    import time

    seconds = max(0, int(time.time()) - created)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@main.command()
@click.argument("folders", nargs=-1, type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def images(folders: tuple[str, ...], as_json: bool) -> None:
    """List gpuenv-built images: project, size, age, and whether a lock refers to it.

    An image is in use while a lock refers to it: the lock of the folder it was built
    from, or of a project in FOLDERS (a project folder, or a folder of projects). With
    FOLDERS, only images built from projects inside them are listed.
    """
    from rich.table import Table

    from gpuenv.cli import ui
    from gpuenv.images.service import list_images

    rows = list_images(_engine(), _mirror(), folders)
    if as_json:
        ui.data(
            [
                {
                    "tags": list(r.info.tags),
                    "id": r.info.id,
                    "project": r.project,
                    "project_dir": r.project_dir,
                    "size": r.info.size,
                    "created": r.info.created,
                    "referenced": r.referenced,
                    "status": r.reason,
                }
                for r in rows
            ]
        )
        return
    if not rows:
        ui.info("no gpuenv-built images")
        return
    table = Table(title_justify="left")
    for column in ("image", "project", "size", "age", "status"):
        table.add_column(column)
    for row in rows:
        status = "[green]in use[/]" if row.referenced else f"[yellow]{row.reason}[/]"
        table.add_row(
            ", ".join(row.info.tags) or row.info.id[:19],
            row.project,
            f"{row.info.size / 1e9:.2f} GB",
            _age(row.info.created),
            status,
        )
    ui.out.print(table)


@main.command()
@click.argument("folders", nargs=-1, type=click.Path(file_okay=False, exists=True))
@click.option("--yes", is_flag=True, help="Remove them (without it, only print what would go).")
def gc(folders: tuple[str, ...], yes: bool) -> None:
    """Remove gpuenv-built images that no lock refers to.

    An image is kept while a lock refers to it: the lock of the folder it was built from,
    or of a project in FOLDERS (name the folders of other checkouts that share images).
    With FOLDERS, only images built from projects inside them are considered. Prints what
    it would remove; --yes removes. Base images and images built FROM gpuenv images are
    never touched.
    """
    from gpuenv.cli import ui
    from gpuenv.images.service import collect, list_images

    engine = _engine()
    rows = list_images(engine, _mirror(), folders)

    def removed(row: Any) -> None:
        ui.success(f"removed {', '.join(row.info.tags) or row.info.id} ({row.reason})")

    doomed = collect(engine, rows, yes, removed)
    if not doomed:
        ui.success("nothing to remove")
    elif not yes:
        for row in doomed:
            ui.info(
                f"would remove {', '.join(row.info.tags) or row.info.id} "
                f"({row.project}: {row.reason})"
            )
        ui.info("run again with --yes to remove them")


def _reap(api: Any) -> list[str]:
    from gpuenv.errors import GpuenvError
    from gpuenv.run.session import reap_orphans

    try:
        return reap_orphans(api)
    except GpuenvError:
        return []  # the run itself reports an unreachable engine


def _stamp_project(project: Any) -> dict[str, Any]:
    """What `gpuenv run` needs of the validated spec and lock, kept in the build stamp."""
    from gpuenv.common.files import file_hash
    from gpuenv.run.container import Locked

    return {
        "spec": project.spec.to_data(),
        "spec_path": project.spec.path,
        "locked": Locked.from_lock(project.lock, file_hash(project.lock_path)).to_data(),
    }


def _build_project(obj: Context, bake: bool, quiet: bool) -> tuple[Any, str, Any]:
    """Read the project, render its image and build it if the engine lacks it (pulling
    and pinning the base first); record the build stamp. Returns the project, the tag
    and the BuildResult (None when the image was already there)."""
    from gpuenv.engine.api import image_exists_fast
    from gpuenv.images.service import build_inputs, load_project, plan
    from gpuenv.project import stamp

    project = load_project(obj.directory)
    mirror = _mirror()
    result = None
    planned = plan(project, mirror, bake=bake) if project.lock.digest else None
    if planned is None or not image_exists_fast(planned.tag):
        from gpuenv.cli.live import make_view
        from gpuenv.images.service import build as do_build
        from gpuenv.images.service import ensure_base

        engine = _engine()
        view = make_view(quiet)
        project, _ = ensure_base(project, engine, view, mirror)
        planned = plan(project, mirror, bake=bake)
        result = do_build(planned, engine, view)
    inputs = build_inputs(project, planned)
    stamp.record(obj.directory, bake, planned.tag, inputs, _stamp_project(project))
    return project, planned.tag, result


def _ensure_image(obj: Context, quiet: bool) -> tuple[Spec, Any, str]:
    """The spec, the lock (as run needs it) and the image tag, building first if missing.

    When nothing changed since the last build, all three come from the build stamp: no
    YAML is parsed and no image is rendered.
    """
    from gpuenv.engine.api import image_exists_fast
    from gpuenv.project import stamp
    from gpuenv.project.spec import spec_from_data
    from gpuenv.run.container import Locked

    known = stamp.fresh(obj.directory, False)
    if known and known.get("project") and image_exists_fast(known["tag"]):
        saved = known["project"]
        spec = spec_from_data(saved["spec"], obj.directory, saved["spec_path"])
        return spec, Locked(**saved["locked"]), str(known["tag"])

    from gpuenv.common.files import file_hash

    project, tag, _ = _build_project(obj, False, quiet)
    return project.spec, Locked.from_lock(project.lock, file_hash(project.lock_path)), tag


def _run(
    obj: Context,
    arguments: tuple[str, ...],
    *,
    gpus: str | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    root: bool,
    memory: str | None,
    wait: float | None,
    force: bool,
    quiet: bool,
    shell: bool,
) -> None:
    from gpuenv.engine.api import EngineAPI
    from gpuenv.errors import GpuRuntimeMissing, UsageError
    from gpuenv.resolution.host import Host, detect_host
    from gpuenv.run.container import (
        command_for,
        container_config,
        environment,
        invoking_identity,
        labels,
        preflight,
        without_gpus,
    )
    from gpuenv.run.session import run_container, stdin_is_input
    from gpuenv.sharing.gpus import grant, parse_gpus_option

    def notice(text: str) -> None:
        if not quiet:
            click.echo(f"gpuenv: {text}", err=True)

    tty = sys.stdin.isatty() and sys.stdout.isatty()
    if shell and not tty:
        raise UsageError("gpuenv shell needs a terminal", hint="use `gpuenv run -- CMD` instead")
    command = ["bash", "-l"] if shell else command_for(arguments)
    api = EngineAPI()
    # Orphans of killed runs are removed alongside: it costs the run no time.
    import threading

    reaped: list[str] = []
    reaper = threading.Thread(target=lambda: reaped.extend(_reap(api)), daemon=True)
    reaper.start()
    spec, locked, tag = _ensure_image(obj, quiet)
    request = parse_gpus_option(gpus) if gpus else spec.gpus
    # No GPUs, no need to ask NVML about them.
    host = detect_host() if request.mode != "none" else Host(None, (), "none")
    granted = grant(request, host)
    store = None
    claimed: list[str] = []
    if host.gpus and granted.mode != "none":
        # A shared host: claim the GPUs under the lock before anything starts on them.
        from gpuenv.sharing.claims import ClaimStore, reserve

        store = ClaimStore()
        granted, claimed = reserve(store, request, host, spec.name, wait, notice)
    try:
        if not force and host.driver is not None and granted.mode != "none":
            from gpuenv.resolution.matrix import load_matrix

            for warning in preflight(locked, host, granted, load_matrix()):
                notice(warning)
        identity = None if root or os.getuid() == 0 else invoking_identity()
        variables = environment(spec, env, env_files, os.environ)
        stdin = tty or stdin_is_input()
        run_labels = labels(spec, locked.lock_hash, granted, identity, command)
        config = container_config(
            spec, tag, command, granted, identity, variables, run_labels, tty=tty, stdin=stdin
        )
        if memory:
            from gpuenv.project.spec import parse_size

            limit = parse_size(memory)
            if limit is None or limit < 6 * 1024**2:
                raise UsageError(f"--memory {memory!r}: not a size of at least 6m (e.g. 32g)")
            config["HostConfig"]["Memory"] = limit

        def start(container: dict[str, Any]) -> Any:
            return run_container(
                api,
                container,
                identity=identity,
                tty=tty,
                stdin=stdin,
                notice=notice,
                second_interrupt_kills=not shell,
            )

        try:
            outcome = start(config)
        except GpuRuntimeMissing:
            if not granted.optional:
                raise
            notice(
                "no NVIDIA runtime in this Docker engine: running without GPUs (GPUs were optional)"
            )
            outcome = start(without_gpus(config))
        reaper.join(timeout=30)
        for name in reaped:
            notice(f"removed {name}, left behind by a gpuenv run that was killed")
        if outcome.oom_killed:
            advice = (
                f"raise --memory (now {memory}), or lower the batch size or the DataLoader workers"
                if memory
                else "lower the batch size or the DataLoader workers, or use a bigger machine"
            )
            click.echo(
                f"gpuenv: the command was killed because it ran out of memory (OOM); {advice}",
                err=True,
            )
        sys.exit(outcome.exit_code)
    finally:
        if store is not None:
            store.release(claimed)


def run_options(func: F) -> F:
    for decorator in reversed(
        [
            click.option(
                "--gpus",
                metavar="GPUS",
                help="all | none | optional | N | 0,2 | device=0 | GPU-<uuid>,... "
                "(default: the spec's gpus).",
            ),
            click.option(
                "-e",
                "--env",
                multiple=True,
                metavar="KEY[=VALUE]",
                help="Set a variable; a bare KEY passes this shell's value (never printed).",
            ),
            click.option(
                "--env-file",
                "env_files",
                multiple=True,
                type=click.Path(dir_okay=False),
                help="Read variables from a file of KEY=VALUE lines.",
            ),
            click.option("--root", is_flag=True, help="Run as root instead of as you."),
            click.option(
                "--wait",
                "wait",
                is_flag=True,
                default=False,
                help="Queue until the GPUs are free (first come, first served).",
            ),
            click.option(
                "--wait-timeout",
                "wait_timeout",
                type=click.FloatRange(min=0, min_open=True),
                metavar="SECONDS",
                help="Wait (as --wait) but give up after SECONDS.",
            ),
            click.option(
                "--memory",
                metavar="SIZE",
                help="Limit the container's memory (e.g. 32g); an out-of-memory kill is reported.",
            ),
            click.option(
                "--force",
                is_flag=True,
                help="Start even if this host's driver or GPUs cannot run the locked image.",
            ),
            quiet_option,
        ]
    ):
        func = decorator(func)
    return func


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@run_options
@click.argument(
    "arguments", nargs=-1, type=click.UNPROCESSED, required=True, metavar="TARGET [ARGS]..."
)
@click.pass_obj
def run(
    obj: Context,
    arguments: tuple[str, ...],
    gpus: str | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    root: bool,
    wait: bool,
    wait_timeout: float | None,
    memory: str | None,
    force: bool,
    quiet: bool,
) -> None:
    """Run TARGET in the project's container: `train.py ARGS` runs python3 on it, and
    `-- CMD ARGS` any command.

    The locked image is used (built first if missing; a stale lock stops here, pointing
    to `gpuenv lock`). The project is mounted at /workspace; the command runs as you, with
    a HOME and a passwd entry, so the files it writes are yours. GPUs come from the spec
    or --gpus, by UUID where known; NVIDIA_VISIBLE_DEVICES is exactly the grant. Shared
    memory, NGC's ulimits and an init process are set. Ctrl-C stops the command (a second
    one kills it); the container is always removed; the exit code is the command's.

    \b
    Examples:
      gpuenv run train.py --lr 3e-4
      gpuenv run --gpus 0,2 -e WANDB_API_KEY train.py
      gpuenv run -- bash -lc 'nvidia-smi && python3 -c "import torch"'
    """
    _run(
        obj,
        arguments,
        gpus=gpus,
        env=env,
        env_files=env_files,
        root=root,
        memory=memory,
        wait=(wait_timeout or 0.0) if wait or wait_timeout else None,
        force=force,
        quiet=quiet,
        shell=False,
    )


@main.command()
@run_options
@click.pass_obj
def shell(
    obj: Context,
    gpus: str | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    root: bool,
    wait: bool,
    wait_timeout: float | None,
    memory: str | None,
    force: bool,
    quiet: bool,
) -> None:
    """Open an interactive shell (bash -l) in the project's container, set up as for run."""
    _run(
        obj,
        (),
        gpus=gpus,
        env=env,
        env_files=env_files,
        root=root,
        memory=memory,
        wait=(wait_timeout or 0.0) if wait or wait_timeout else None,
        force=force,
        quiet=quiet,
        shell=True,
    )


def _runs(show_all: bool) -> list[Any]:
    from gpuenv.engine.api import EngineAPI
    from gpuenv.run.container import RUN_LABEL
    from gpuenv.sharing.monitor import runs_from

    runs = runs_from(EngineAPI().containers(RUN_LABEL))
    return runs if show_all else [r for r in runs if r.state == "running"]


@main.command()
@click.option(
    "--all", "show_all", is_flag=True, help="Also runs that have stopped but not been removed."
)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
def ps(show_all: bool, as_json: bool) -> None:
    """List the gpuenv runs on this host: project, user, GPUs, command, image, uptime."""
    from dataclasses import asdict

    from rich.table import Table

    from gpuenv.cli import ui

    runs = _runs(show_all)
    if as_json:
        ui.data([{**asdict(r), "uptime": r.uptime} for r in runs])
        return
    if not runs:
        ui.info("no gpuenv runs on this host")
        return
    table = Table(title_justify="left")
    for column in ("run", "project", "user", "GPUs", "command", "image", "up"):
        table.add_column(column, overflow="fold")
    for run in runs:
        # UUIDs are long: their first block is enough to tell GPUs apart on a table.
        gpus = ",".join(g[:12] if g.startswith("GPU-") else g for g in run.gpus.split(","))
        table.add_row(run.name, run.project, run.user, gpus, run.command, run.image, run.uptime)
    ui.out.print(table)


@main.command()
@click.argument("run_name", metavar="RUN")
def stop(run_name: str) -> None:
    """Stop a gpuenv run (by name or id, as `gpuenv ps` shows): its owner, or root.

    The run's command gets SIGTERM, then SIGKILL after 10 s; its gpuenv process then
    removes the container and releases its GPUs.
    """
    from gpuenv.cli import ui
    from gpuenv.engine.api import EngineAPI
    from gpuenv.errors import UsageError

    matches = [r for r in _runs(True) if r.name == run_name or r.id.startswith(run_name)]
    if not matches:
        raise UsageError(f"no gpuenv run named {run_name!r}", hint="`gpuenv ps` lists them")
    if len(matches) > 1:
        raise UsageError(f"{run_name!r} matches {len(matches)} runs; give more of the id")
    run = matches[0]
    if os.getuid() != 0 and run.uid is not None and run.uid != os.getuid():
        raise UsageError(f"{run.name} belongs to {run.user}: only its owner or root can stop it")
    EngineAPI().call("POST", f"/containers/{run.id}/stop", query={"t": "10"}, timeout=60)
    ui.success(f"stopped {run.name} ({run.project}, {run.user})")


def _top_data() -> tuple[Any, list[Any]]:
    from gpuenv.resolution.host import detect_host
    from gpuenv.sharing.claims import ClaimStore
    from gpuenv.sharing.monitor import gpu_rows

    host = detect_host()
    if not host.gpus:
        return host, []
    try:
        claims = ClaimStore().claims()
    except Exception:  # a read-only or missing state folder: show the GPUs anyway
        claims = []
    return host, gpu_rows(host, claims, _runs(False))


def _top_table(host: Any, rows: list[Any]) -> Any:
    from rich.table import Table

    table = Table(title=host.describe(), title_justify="left")
    for column in ("GPU", "name", "util", "memory", "temp", "power", "held by / used by"):
        table.add_column(column, overflow="fold")

    def number(value: Any, unit: str) -> str:
        return "-" if value is None else f"{value:.0f}{unit}"

    for row in rows:
        users = []
        if row.claimed_by:
            users.append(f"claimed: {row.claimed_by['user']} ({row.claimed_by['project']})")
        for user in row.users:
            if user["gpuenv"]:
                users.append(f"{user['run']} ({user['project']}, {user['user']}) pid {user['pid']}")
            else:
                where = f"container {user['container']}" if user["container"] else "no container"
                users.append(
                    f"[yellow]outside gpuenv[/]: pid {user['pid']} ({user['user']}, {where})"
                )
        memory = (
            f"{number(row.memory_used_mib, '')}/{number(row.memory_total_mib, ' MiB')}"
            if row.memory_total_mib
            else number(row.memory_used_mib, " MiB")
        )
        power = f"{number(row.power_w, '')}/{number(row.power_limit_w, ' W')}"
        table.add_row(
            str(row.index),
            row.name,
            number(row.utilization, "%"),
            memory,
            number(row.temperature_c, "°C"),
            power,
            "\n".join(users) or "[green]free[/]",
        )
    return table


@main.command()
@click.option("--once", is_flag=True, help="Print one snapshot and exit.")
@click.option("--json", "as_json", is_flag=True, help="One snapshot as JSON (implies --once).")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes.")
def top(once: bool, as_json: bool, interval: float) -> None:
    """A live view of every GPU: utilization, memory, temperature, power, and which run,
    container and user holds it (NVML's process IDs mapped to containers through their
    cgroups). GPUs used by processes outside gpuenv are shown as such."""
    import time

    from gpuenv.cli import ui

    host, rows = _top_data()
    if not host.gpus:
        message = f"no NVIDIA GPU on this host ({host.note or host.describe()}): nothing to show"
        if as_json:
            ui.data({"host": host.to_data(), "gpus": [], "message": message})
        else:
            ui.info(message)
        return
    if as_json:
        summary = {k: v for k, v in host.to_data().items() if k != "gpus"}
        ui.data({"host": summary, "gpus": [r.to_data() for r in rows]})
        return
    if once:
        ui.out.print(_top_table(host, rows))
        return
    from rich.live import Live

    with Live(_top_table(host, rows), console=ui.out, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                host, rows = _top_data()
                live.update(_top_table(host, rows), refresh=True)
        except KeyboardInterrupt:
            pass


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.pass_obj
def doctor(obj: Context, as_json: bool) -> None:
    """Check this machine for gpuenv: Docker engine and API, NVIDIA runtime, driver and
    NVML, the project's lock against this host, free disk, nvcr.io credentials and the
    state folder. Exits 15 when a check fails."""
    from rich.markup import escape

    from gpuenv.cli import ui
    from gpuenv.errors import EXIT_DOCTOR
    from gpuenv.run.doctor import run_checks

    checks = run_checks(obj.directory)
    if as_json:
        ui.data([c.to_data() for c in checks])
    else:
        marks = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}
        for check in checks:
            ui.out.print(f"{marks[check.status]} {escape(check.name)}: {escape(check.detail)}")
            if check.remedy:
                ui.out.print(f"       [cyan]→[/] {escape(check.remedy)}")
    if any(c.status == "fail" for c in checks):
        sys.exit(EXIT_DOCTOR)


@main.command("push")
@click.argument("repository", required=False, metavar="[REGISTRY/REPO[:TAG]]")
@quiet_option
@click.pass_obj
def push_command(obj: Context, repository: str | None, quiet: bool) -> None:
    """Push the project image, with the code baked in, to a team registry, and record
    the pushed reference and digest in gpuenv.lock: teammates and cluster nodes (gpuenv
    submit, gpuenv export) then pull it by digest instead of rebuilding. Without an
    argument, pushes to the repository of the last push."""
    from gpuenv.cli import ui
    from gpuenv.cli.live import make_view
    from gpuenv.errors import UsageError
    from gpuenv.images.registry import parse_reference
    from gpuenv.images.service import load_project
    from gpuenv.images.service import push as do_push

    project = load_project(obj.directory)
    if repository is None:
        previous = (project.lock.extra.get("pushed") or {}).get("reference")
        if not previous:
            raise UsageError(
                "where to? give a repository, e.g. gpuenv push registry.example.com/team/project"
            )
        repository = parse_reference(str(previous)).repository
    if not quiet:
        ui.step(f"pushing the project image, code baked in, to {repository}")
    project, image = do_push(project, _engine(), make_view(quiet), _mirror(), repository)
    ui.result(image)
    if not quiet:
        ui.success(
            f"pushed {project.lock.extra['pushed']['reference']}; gpuenv.lock records {image}"
        )


def _warn_if_pushed_is_stale(project: Any) -> None:
    """The pushed image carries the code as it was: say so when the project moved on."""
    from gpuenv.cli import ui
    from gpuenv.images.service import plan

    pushed = project.lock.extra.get("pushed") or {}
    reference = str(pushed.get("reference", ""))
    if not reference or project.lock.digest == "":
        return
    current = plan(project, _mirror(), bake=True).tag.rsplit(":", 1)[1]
    if reference.rsplit(":", 1)[-1] != current:
        ui.warn(
            "the project changed since the last `gpuenv push`: the pushed image carries the "
            "old code and requirements; run `gpuenv push` again"
        )


def _cluster_env(
    spec: Spec, env: tuple[str, ...], env_files: tuple[str, ...]
) -> tuple[dict[str, str], list[str]]:
    """Values to write (spec env, env files, -e KEY=VALUE) and bare -e KEY names."""
    from gpuenv.run.container import environment

    passthrough = [e for e in env if "=" not in e]
    values = environment(spec, [e for e in env if "=" in e], env_files, {})
    return values, passthrough


def _cluster_gpus(spec: Spec, gpus: int | None) -> int:
    if gpus is not None:
        return gpus
    request = spec.gpus
    if request.mode == "count":
        return request.count or 0
    if request.mode == "devices":
        return len(request.devices)
    return 0 if request.mode == "none" else 1


cluster_options = [
    click.option(
        "--gpus", type=click.IntRange(min=0), help="GPUs per job (default: the spec's count, or 1)."
    ),
    click.option(
        "-e", "--env", multiple=True, metavar="KEY[=VALUE]", help="A variable for the job."
    ),
    click.option("--env-file", "env_files", multiple=True, type=click.Path(dir_okay=False)),
]


def _cluster(func: F) -> F:
    for option in reversed(cluster_options):
        func = option(func)
    return func


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_cluster
@click.option("--time", "time_limit", metavar="TIME", help="Slurm time limit, e.g. 04:00:00.")
@click.option("--partition", help="Slurm partition.")
@click.option("--nodes", type=click.IntRange(min=1), help="Number of nodes.")
@click.option(
    "--sbatch-arg",
    "sbatch_args",
    multiple=True,
    metavar="--OPTION=VALUE",
    help="Any other sbatch option (repeatable).",
)
@click.option(
    "--launcher",
    type=click.Choice(["docker", "pyxis"]),
    default="docker",
    show_default=True,
    help="docker run on the node, or srun with pyxis/enroot.",
)
@click.option("--dry-run", is_flag=True, help="Print the sbatch script; submit nothing.")
@click.argument(
    "arguments", nargs=-1, type=click.UNPROCESSED, required=True, metavar="TARGET [ARGS]..."
)
@click.pass_obj
def submit(
    obj: Context,
    gpus: int | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    time_limit: str | None,
    partition: str | None,
    nodes: int | None,
    sbatch_args: tuple[str, ...],
    launcher: str,
    dry_run: bool,
    arguments: tuple[str, ...],
) -> None:
    """Submit TARGET to Slurm, in the locked image (by the digest `gpuenv push` recorded).

    The job asks for --gres=gpu:N; its step runs the image with exactly the GPUs Slurm
    granted (SLURM_JOB_GPUS), the project mounted at /workspace, as you, and passes the
    exit code back to Slurm. Output goes to .gpuenv/slurm/ in the project.
    """
    import subprocess
    import time

    from gpuenv.cli import ui
    from gpuenv.cluster.slurm import pushed_image, sbatch_script
    from gpuenv.common.files import atomic_write
    from gpuenv.errors import UsageError
    from gpuenv.images.service import load_project
    from gpuenv.run.container import command_for, shm_size

    project = load_project(obj.directory)
    spec = project.spec
    values, passthrough = _cluster_env(spec, env, env_files)
    _warn_if_pushed_is_stale(project)
    output_dir = os.path.join(obj.directory, ".gpuenv", "slurm")
    script = sbatch_script(
        spec,
        pushed_image(project.lock.extra),
        command_for(arguments),
        values,
        passthrough=passthrough,
        gpus=_cluster_gpus(spec, gpus),
        output_dir=output_dir,
        shm_size=shm_size(spec) or 8 * 1024**3,
        launcher=launcher,
        time_limit=time_limit,
        partition=partition,
        nodes=nodes,
        extra=sbatch_args,
    )
    if dry_run:
        click.echo(script, nl=False)
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch")
    atomic_write(path, script, mode=0o755)
    try:
        result = subprocess.run(
            ["sbatch", "--parsable", path],
            cwd=obj.directory,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise UsageError(
            "sbatch is not on PATH: this is not a Slurm login node",
            hint=f"the script is ready at {path}; or use --dry-run",
        ) from None
    if result.returncode != 0:
        raise UsageError(f"sbatch refused the job: {result.stderr.strip()}", hint=f"script: {path}")
    job = result.stdout.strip().split(";")[0]
    ui.result(job)
    ui.success(f"submitted job {job} ({path}); `gpuenv jobs` follows it")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.pass_obj
def jobs(obj: Context, as_json: bool) -> None:
    """This project's Slurm jobs that are pending or running (squeue)."""
    import subprocess

    from gpuenv.cli import ui
    from gpuenv.cluster.slurm import job_name
    from gpuenv.errors import UsageError
    from gpuenv.project.spec import load_spec

    name = job_name(load_spec(obj.directory))
    try:
        result = subprocess.run(
            ["squeue", "--noheader", f"--name={name}", "--format=%i|%T|%M|%D|%R"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise UsageError("squeue is not on PATH: this is not a Slurm login node") from None
    if result.returncode != 0:
        raise UsageError(f"squeue failed: {result.stderr.strip()}")
    rows = [line.split("|") for line in result.stdout.splitlines() if line.strip()]
    data = [
        dict(zip(("job", "state", "time", "nodes", "where"), row, strict=False)) for row in rows
    ]
    if as_json:
        ui.data(data)
    elif not data:
        ui.info(f"no pending or running jobs named {name}")
    else:
        for job in data:
            ui.out.print(
                f"{job['job']:>8}  {job['state']:<10} {job['time']:>10}  {job['where']}",
                markup=False,
            )


@main.group()
def export() -> None:
    """Write the locked environment for another scheduler (to stdout)."""


def _export_inputs(
    obj: Context, env: tuple[str, ...], env_files: tuple[str, ...]
) -> tuple[Any, dict[str, str]]:
    from gpuenv.errors import UsageError
    from gpuenv.images.service import load_project

    project = load_project(obj.directory)
    values, passthrough = _cluster_env(project.spec, env, env_files)
    if passthrough:
        raise UsageError(
            f"-e {passthrough[0]} has no value: exported files carry values (-e KEY=VALUE), "
            "keep secrets in the scheduler's own secret store"
        )
    return project, values


@export.command(
    "kubernetes",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@_cluster
@click.argument(
    "arguments", nargs=-1, type=click.UNPROCESSED, required=True, metavar="TARGET [ARGS]..."
)
@click.pass_obj
def export_kubernetes(
    obj: Context,
    gpus: int | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    arguments: tuple[str, ...],
) -> None:
    """A Kubernetes Job running TARGET in the pushed image (by digest), with nvidia.com/gpu
    limits, /dev/shm as a memory-backed emptyDir, a non-root user and no restarts."""
    import yaml

    from gpuenv.cluster.slurm import kubernetes_job, pushed_image
    from gpuenv.run.container import command_for, shm_size

    project, values = _export_inputs(obj, env, env_files)
    _warn_if_pushed_is_stale(project)
    manifest = kubernetes_job(
        project.spec,
        pushed_image(project.lock.extra),
        command_for(arguments),
        values,
        gpus=_cluster_gpus(project.spec, gpus),
        shm_size=shm_size(project.spec) or 8 * 1024**3,
        uid=os.getuid(),
        gid=os.getgid(),
    )
    click.echo(yaml.safe_dump(manifest, sort_keys=False), nl=False)


@export.command(
    "compose",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@_cluster
@click.argument(
    "arguments", nargs=-1, type=click.UNPROCESSED, required=True, metavar="TARGET [ARGS]..."
)
@click.pass_obj
def export_compose(
    obj: Context,
    gpus: int | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    arguments: tuple[str, ...],
) -> None:
    """A docker-compose.yaml service running TARGET in the project image: the pushed
    digest, or else the locally built tag; GPUs reserved by count or device ids."""
    import yaml

    from gpuenv.cluster.slurm import compose_file
    from gpuenv.run.container import command_for, shm_size

    project, values = _export_inputs(obj, env, env_files)
    pushed = (project.lock.extra.get("pushed") or {}).get("image")
    image = pushed or _ensure_image(obj, quiet=True)[2]
    request = project.spec.gpus
    devices = list(request.devices) if request.mode == "devices" and gpus is None else []
    manifest = compose_file(
        project.spec,
        image,
        command_for(arguments),
        values,
        gpus=None if devices else _cluster_gpus(project.spec, gpus),
        device_ids=devices,
        shm_size=shm_size(project.spec) or 8 * 1024**3,
        uid=os.getuid(),
        gid=os.getgid(),
    )
    click.echo(yaml.safe_dump(manifest, sort_keys=False), nl=False)


if __name__ == "__main__":  # pragma: no cover
    main()
