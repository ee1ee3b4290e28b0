"""`gpuenv render`, `pull`, `images`, `gc` and `push`: the project image, each a function
of the project folder and the engine that the CLI parses for and shows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuenv.app.mirror import configured_mirror
from gpuenv.app.platforms import engine_platform
from gpuenv.engine.protocol import BuildCache, Engine
from gpuenv.errors import UsageError
from gpuenv.images.bake import BakePolicy
from gpuenv.images.inventory import GcOutcome, ImageRow, collect, dependency_caches, list_images
from gpuenv.images.progress import View
from gpuenv.images.registry import parse_reference
from gpuenv.images.render import BuildPlan
from gpuenv.images.service import ensure_base, plan
from gpuenv.images.service import push as push_built
from gpuenv.lock.project import load_project


def render_plan(directory: str, bake: bool) -> BuildPlan:
    """The build `gpuenv build` would run for the project: its Dockerfile and context."""
    return plan(load_project(directory), configured_mirror(), bake=bake)


@dataclass(frozen=True)
class Pulled:
    """The base image `gpuenv pull` made present: the locked name and digest, the local
    reference, and whether the lock already had the digest."""

    image: str
    digest: str
    local: str
    had_digest: bool


def pull_base(directory: str, engine: Engine, view: View) -> Pulled:
    """Make the locked base present and pin its digest (packages may wait: the lock is
    read as it is)."""
    project = load_project(directory, "frozen")
    had_digest = bool(project.lock.digest)
    project, local = ensure_base(project, engine, view, configured_mirror())
    return Pulled(project.lock.image, str(project.lock.digest), local, had_digest)


def image_rows(engine: Engine, folders: Sequence[str]) -> list[ImageRow]:
    """The gpuenv-built images (of projects inside `folders`, when given), each with
    whether a lock refers to it."""
    return list_images(engine, configured_mirror(), folders)


def collect_images(engine: Engine, folders: Sequence[str], remove: bool) -> GcOutcome:
    """The images no lock refers to: removed when `remove`, else only listed."""
    return collect(engine, list_images(engine, configured_mirror(), folders), remove)


@dataclass(frozen=True)
class CacheSweep:
    """`gpuenv gc --caches`: the caches kept (in use), those no build uses, and the bytes
    freed (None when nothing was removed). `found` is False where the engine offers no
    API for its caches (buildah)."""

    found: bool
    in_use: list[BuildCache]
    unused: list[BuildCache]
    freed: int | None = None


def sweep_caches(engine: Engine, remove: bool) -> CacheSweep:
    """The engine's dependency caches, those no build uses removed when `remove`."""
    found = dependency_caches(engine)
    if found is None:
        return CacheSweep(False, [], [])
    unused = [cache for cache in found if not cache.in_use]
    in_use = [cache for cache in found if cache.in_use]
    freed = engine.remove_build_caches([c.id for c in unused]) if remove and unused else None
    return CacheSweep(True, in_use, unused, freed)


def push_image(
    directory: str,
    repository: str | None,
    engine: Callable[[], Engine],
    view: Callable[[], View],
    policy: BakePolicy,
    notice: Callable[[str], None],
    announce: Callable[[str], None] = lambda _: None,
) -> tuple[str, str]:
    """Build the image with the code baked in, push it to `repository` (None: the last
    push's; `announce` is told which before anything is built) and record it in the
    lock; returns the pushed reference and the image by digest. UsageError when there is
    no repository to push to."""
    project = load_project(directory)
    if repository is None:
        previous = (project.lock.extra.get("pushed") or {}).get("reference")
        if not previous:
            raise UsageError(
                "where to? give a repository, e.g. gpuenv push registry.example.com/team/project"
            )
        repository = parse_reference(str(previous)).repository
    announce(repository)
    shown, connected = view(), engine()
    project, image = push_built(
        project,
        connected,
        shown,
        configured_mirror(),
        repository,
        engine_platform(connected),
        bake_policy=policy,
        notice=notice,
    )
    return str(project.lock.extra["pushed"]["reference"]), image
