"""gpuenv render, pull, images, gc, push: the project image."""

from __future__ import annotations

import click

from gpuenv.app.images import (
    collect_images,
    image_rows,
    pull_base,
    push_image,
    render_plan,
    sweep_caches,
)
from gpuenv.cli import output, ui
from gpuenv.cli.context import (
    Application,
    bake_checks,
    bake_option,
    quiet_option,
    view_factory,
)
from gpuenv.cli.views import images_table
from gpuenv.errors import UsageError
from gpuenv.images.bake import BakePolicy


@click.command()
@bake_option
@click.option(
    "--context",
    "context_dir",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Also write the whole build context (the Dockerfile and its files) into DIR, a "
    "new or empty folder, to build elsewhere: `docker buildx build DIR`.",
)
@click.pass_obj
def render(obj: Application, bake: bool, context_dir: str | None) -> None:
    """Print the Dockerfile `gpuenv build` would build with BuildKit; builds nothing.

    The base is pinned by digest once `gpuenv pull` (or `gpuenv build`) has recorded it
    in gpuenv.lock; with a registry mirror, FROM names the mirror. Dependency downloads
    go to cache mounts (RUN --mount=type=cache) named for you, and uv installs the
    requirements (installer: pip in gpuenv.yaml for pip); it builds with any BuildKit
    (`docker buildx build`, `docker build` on Docker 23 and later) and with Podman.
    """
    planned = render_plan(obj.directory, bake)
    click.echo(planned.dockerfile, nl=False)
    if context_dir:
        planned.write(context_dir)
        ui.success(f"wrote the build context to {context_dir}: `docker buildx build {context_dir}`")


@click.command()
@quiet_option
@click.pass_obj
def pull(obj: Application, quiet: bool) -> None:
    """Pull the locked base image and pin its digest in gpuenv.lock.

    Uses the digest once the lock has one, so a moved tag never changes what you get.
    NGC_API_KEY (for nvcr.io) and Docker's stored credentials are used; with
    GPUENV_REGISTRY_MIRROR=host:port (or registry_mirror in the user config file)
    nvcr.io images are pulled from the mirror, and the lock keeps the canonical name.
    """
    pulled = pull_base(obj.directory, obj.engine(), view_factory(quiet)())
    output.result(pulled.local)
    if pulled.had_digest:
        ui.success(f"{pulled.image} is present (pinned at {pulled.digest})")
    else:
        ui.success(f"pinned {pulled.image} at {pulled.digest} in gpuenv.lock")


@click.command()
@click.argument("folders", nargs=-1, type=click.Path(file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.pass_obj
def images(app: Application, folders: tuple[str, ...], as_json: bool) -> None:
    """List gpuenv-built images: project, size, age, and whether a lock refers to it.

    An image is in use while a lock refers to it: the lock of the folder it was built
    from, or of a project in FOLDERS (a project folder, or a folder of projects). With
    FOLDERS, only images built from projects inside them are listed.
    """
    rows = image_rows(app.engine(), folders)
    if as_json:
        output.data([row.to_data() for row in rows])
    elif not rows:
        ui.info("no gpuenv-built images")
    else:
        ui.table(images_table(rows))


@click.command()
@click.argument("folders", nargs=-1, type=click.Path(file_okay=False, exists=True))
@click.option("--yes", is_flag=True, help="Remove them (without it, only print what would go).")
@click.option(
    "--caches",
    is_flag=True,
    help="The builds' dependency caches (downloaded wheels, uv's and apt's caches) "
    "instead of images.",
)
@click.pass_obj
def gc(app: Application, folders: tuple[str, ...], yes: bool, caches: bool) -> None:
    """Remove gpuenv-built images that no lock refers to.

    An image is kept while a lock refers to it: the lock of the folder it was built from,
    or of a project in FOLDERS (name the folders of other checkouts that share images).
    With FOLDERS, only images built from projects inside them are considered. An image a
    container still uses (a stopped one too) is kept, and the container named. Prints
    what it would remove; --yes removes. Base images and images built FROM gpuenv images
    are never touched.

    With --caches, the dependency caches that builds keep in the engine's BuildKit
    instead: every user's (Docker does not say whose; the next build downloads again).
    Podman's are folders on its host (/var/tmp/buildah-cache): gpuenv says where.
    """
    if caches:
        if folders:
            raise UsageError("--caches takes no folders: the caches belong to the engine")
        _gc_caches(app, yes)
        return
    outcome = collect_images(app.engine(), folders, yes)
    for row in outcome.removed:
        ui.success(f"removed {', '.join(row.info.tags) or row.info.id} ({row.reason})")
    for row, holders in outcome.held:
        ui.warn(
            f"kept {', '.join(row.info.tags) or row.info.id} ({row.reason}): used by "
            f"container {', '.join(holders)}; remove the container first (`docker rm`)"
        )
    if not yes:
        for row in outcome.doomed:
            ui.info(
                f"would remove {', '.join(row.info.tags) or row.info.id} "
                f"({row.project}: {row.reason})"
            )
        if outcome.doomed:
            ui.info("run again with --yes to remove them")
    if not outcome.doomed and not outcome.removed and not outcome.held:
        ui.success("nothing to remove")


def _gc_caches(app: Application, yes: bool) -> None:
    connected = app.engine()
    sweep = sweep_caches(connected, yes)
    if not sweep.found:
        ui.warn(
            f"{connected.endpoint} builds with buildah, which keeps cache mounts in folders on "
            "the Podman host and offers no API for them: remove the gpuenv-* folders in "
            "/var/tmp/buildah-cache there (rootless Podman: in its user's TMPDIR)"
        )
        return
    for cache in sweep.in_use:
        ui.warn(f"kept {cache.id} ({ui.size_text(cache.size)}): a build is using it")
    if not sweep.unused:
        ui.success("no dependency caches to remove")
        return
    total = ui.size_text(sum(cache.size for cache in sweep.unused))
    caches = f"{len(sweep.unused)} dependency cache" + ("s" if len(sweep.unused) > 1 else "")
    if sweep.freed is None:
        ui.info(f"would remove {caches} ({total}); run again with --yes")
        return
    ui.success(f"removed {caches} ({ui.size_text(sweep.freed)} freed)")


@click.command("push")
@click.argument("repository", required=False, metavar="[REGISTRY/REPO[:TAG]]")
@bake_checks
@quiet_option
@click.pass_obj
def push(
    obj: Application,
    repository: str | None,
    allow_secrets: tuple[str, ...],
    allow_large: bool,
    quiet: bool,
) -> None:
    """Push the project image, with the code baked in, to a team registry, and record
    the pushed reference and digest in gpuenv.lock: teammates and cluster nodes (gpuenv
    submit, gpuenv export) then pull it by digest instead of rebuilding. Without an
    argument, pushes to the repository of the last push. The baked project is checked
    as for `gpuenv build --bake` (credentials, size) before anything is built."""
    reference, image = push_image(
        obj.directory,
        repository,
        obj.engine,
        view_factory(quiet),
        BakePolicy(allow_secrets, allow_large),
        notice=(lambda _: None) if quiet else ui.info,
        announce=(lambda _: None)
        if quiet
        else lambda to: ui.step(f"pushing the project image, code baked in, to {to}"),
    )
    output.result(image)
    if not quiet:
        ui.success(f"pushed {reference}; gpuenv.lock records {image}")
