"""gpuenv build: the project image. Its own module: a build with nothing to do is one
look at the build stamp and one question to the engine, so it loads neither the build
path nor rich until there is something to build."""

from __future__ import annotations

import click

from gpuenv.app.image import up_to_date_tag
from gpuenv.cli import output
from gpuenv.cli.base import up_to_date
from gpuenv.cli.context import (
    Application,
    bake_checks,
    bake_option,
    freshness,
    freshness_options,
    quiet_option,
    view_factory,
)
from gpuenv.images.bake import BakePolicy


@click.command()
@bake_option
@bake_checks
@freshness_options
@quiet_option
@click.pass_obj
def build(
    obj: Application,
    bake: bool,
    allow_secrets: tuple[str, ...],
    allow_large: bool,
    locked: bool,
    frozen: bool,
    quiet: bool,
) -> None:
    """Build the project image: the locked base (pulled and pinned first if needed), apt
    packages, and exactly the Python packages gpuenv.lock pins (each file's sha256
    checked, nothing resolved: a file whose hash differs fails the build, exit 12).

    After a requirements edit (or with a lock whose Python packages are not resolved
    yet), they are resolved first in the base image, keeping the locked versions the
    edit does not move, and gpuenv.lock is written; gpuenv says what changed. --locked
    refuses instead (exit 5, for CI); --frozen builds the lock as it is.

    The tag is a hash of the base digest, the Dockerfile and the files copied in, the
    locked package set among them (gpuenv/<name>:<hash>): when nothing changed, the image
    is found and nothing is built. Project code is mounted at run time, not copied,
    unless --bake.

    Docker builds with BuildKit, Podman with buildah. Requirements are installed with uv
    (`installer: pip` in gpuenv.yaml for pip); downloads stay in cache mounts of your
    own, so a rebuild downloads only what changed (`gpuenv gc --caches` clears them).

    With --bake, the project's .dockerignore applies with Docker's rules; files that look
    like credentials stop the build (exit 12) unless .dockerignore leaves them out or
    --allow-secret names them, and so does a project over 2 GiB unless --allow-large.
    """

    # The no-op path: nothing changed since the last build, and the engine has the image.
    connected = obj.engine()
    policy = freshness(locked, frozen)
    known = up_to_date_tag(obj.directory, bake, connected)
    if known:
        up_to_date(known, quiet)
        return

    # The build path (the lock, the matrix, render, pull) and rich's output: only now.
    from gpuenv.app.build import build_project
    from gpuenv.cli import ui

    _, tag, result = build_project(
        obj.directory,
        connected,
        view_factory(quiet),
        bake=bake,
        bake_policy=BakePolicy(allow_secrets, allow_large),
        notice=(lambda _: None) if quiet else ui.info,
        freshness=policy,
    )
    if result is None:
        up_to_date(tag, quiet)
        return
    output.result(tag)
    if not quiet:
        if result.built:
            steps = "step" if result.cached_steps == 1 else "steps"
            ui.success(
                f"built {result.tag} in {result.seconds:.1f}s ({result.cached_steps} {steps} "
                "from cache)"
            )
        else:
            ui.success("up to date: nothing to build")
