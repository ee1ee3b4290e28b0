"""Pull the locked base image, build the project image, push it (`inventory` lists and
collects the images built).

The core of the images capability: it talks to an `Engine` and reports progress to a
`View`, and never imports docker or rich itself.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuenv.common.filelock import exclusive
from gpuenv.common.files import file_hash
from gpuenv.common.labels import LABEL_PREFIX
from gpuenv.engine.failures import pull_error, redact, transient
from gpuenv.engine.protocol import Builder, Engine, Event
from gpuenv.errors import BuildError, GpuenvWarning, LockError, PullError
from gpuenv.images.bake import BakePolicy, check_bake
from gpuenv.images.progress import BuildProgress, BuildView, PullProgress, PullView, View
from gpuenv.images.registry import credentials, parse_reference, pull_repository
from gpuenv.images.registry import credentials as auth_for
from gpuenv.images.render import BuildPlan, plan_build
from gpuenv.lock.facts import image_facts, reconcile
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    Lock,
    write_lock,
)
from gpuenv.lock.project import Project

PROJECT_LABEL = f"{LABEL_PREFIX}.project"


def consume_pull(events: Iterator[Event], reference: str, view: PullView) -> PullProgress:
    progress = PullProgress()
    view.pull_started(reference)
    for event in events:
        progress.feed(event)
        if progress.error:
            break
        view.pull_event(progress)
    view.pull_finished(progress)
    if progress.error:
        raise pull_error(reference, progress.error)
    return progress


REGISTRY_RETRIES = 3  # a pull or push the registry failed for a moment: asked again
REGISTRY_BACKOFF = 2.0  # seconds before the first retry; doubled each time


def with_retries(action: Callable[[], Any], what: str) -> Any:
    """`action` (a pull or a push through the engine), asked again with backoff while it
    fails because the registry is busy (429) or failing (5xx); any other failure, or the
    last one, is raised. Each retry is said (a GpuenvWarning, which the CLI shows)."""
    for attempt in range(REGISTRY_RETRIES + 1):
        try:
            return action()
        except PullError as exc:
            if attempt == REGISTRY_RETRIES or not transient(exc.message):
                raise
            delay = REGISTRY_BACKOFF * 2**attempt
            warnings.warn(
                f"the {what} failed for a moment ({exc.message}); trying again in "
                f"{delay:g} s ({attempt + 1} of {REGISTRY_RETRIES})",
                GpuenvWarning,
                stacklevel=2,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")


def ensure_base(
    project: Project, engine: Engine, view: PullView, mirror: str | None
) -> tuple[Project, str]:
    """Make the locked base image present; pin its digest in the lock on first pull.
    What the image says of itself (its NGC environment) fills what the lock did not
    know, and an image that contradicts the lock is refused (LockError, exit 5).

    Returns the project (with the digest) and the local reference to build FROM.
    """
    lock = project.lock
    canonical = parse_reference(lock.image)
    repository = pull_repository(canonical.repository, mirror)
    auth = credentials(repository)
    if lock.digest:
        local = f"{repository}@{lock.digest}"
        if not engine.has_image(local):
            with_retries(
                lambda: consume_pull(engine.pull(repository, lock.digest, auth), local, view),
                f"pull of {local}",
            )
            if not engine.has_image(local):
                raise PullError(f"the pull of {local} finished, but the engine does not have it")
        return _checked_against_image(project, lock, engine, local), local
    tag = canonical.tag
    assert tag is not None
    reference = f"{repository}:{tag}"
    progress = with_retries(
        lambda: consume_pull(engine.pull(repository, tag, auth), reference, view),
        f"pull of {reference}",
    )
    digests = [d for d in engine.repo_digests(reference) if d.startswith(f"{repository}@")]
    digest = progress.digest or (digests[0].split("@", 1)[1] if digests else None)
    if not digest:
        raise PullError(
            f"{reference} has no registry digest after the pull",
            hint="the image must come from a registry (not `docker load`) for gpuenv to pin it",
        )
    pinned = replace(lock, digest=digest)
    local = f"{repository}@{digest}"
    return _checked_against_image(project, pinned, engine, local, write=True), local


def _checked_against_image(
    project: Project, lock: Lock, engine: Engine, local: str, *, write: bool = False
) -> Project:
    """The project with its lock reconciled with what the image `local` states: values
    the lock did not know filled in (and the lock written, as with a new digest);
    LockError when the image contradicts the lock."""
    framework = str(lock.resolved.get("framework") or "none")
    facts = image_facts(framework, engine.image_config(local))
    resolved, filled, contradictions = reconcile(lock.resolved, facts)
    if contradictions:
        raise LockError(
            f"{local} is not the image {LOCK_FILENAME} describes: " + "; ".join(contradictions),
            hint=(
                "the registry's image differs from the matrix's record of it: "
                "`gpuenv matrix sync` records what the registry's images say, then "
                "`gpuenv lock --upgrade` re-resolves"
                if lock.image.startswith("nvcr.io/")
                else "`gpuenv lock --upgrade` reads the image again and pins what it says"
            ),
        )
    if filled:
        lock = replace(lock, resolved=resolved)
        write = True
    if write:
        with exclusive(project.lock_path):
            write_lock(project.lock_path, lock)
    return Project(project.spec, lock, project.lock_path)


def plan(
    project: Project, mirror: str | None, *, bake: bool = False, builder: Builder = "buildkit"
) -> BuildPlan:
    """The project's image as `builder` builds it (BuildKit's, or buildah's, Dockerfile
    has cache mounts and installs with uv; the classic builder's has neither)."""
    canonical = parse_reference(project.lock.image)
    return plan_build(
        project.spec,
        project.lock,
        pull_repository=pull_repository(canonical.repository, mirror),
        bake=bake,
        lock_digest=file_hash(project.lock_path),
        builder=builder,
    )


def build_inputs(project: Project, plan: BuildPlan) -> list[str]:
    """The files whose change can change the image: spec, lock, and what is copied in."""
    paths = [project.spec.path or "", project.lock_path]
    copied = [f.origin or f.path for f in plan.files]
    inputs = [p for p in paths if p] + [p for p in copied if p] + list(plan.sources)
    if plan.baked:
        # A file added to (or removed from) the baked tree changes no file recorded
        # above, but it changes its folder: the folders of the baked files and their
        # parents up to the project, and .dockerignore are inputs too.
        root = os.path.abspath(project.spec.project_dir)
        folders = {root}
        for path in filter(None, copied):
            folder = os.path.dirname(os.path.abspath(path))
            while folder.startswith(root + os.sep) and folder not in folders:
                folders.add(folder)
                folder = os.path.dirname(folder)
        ignore = os.path.join(root, ".dockerignore")  # made later: the root changes
        inputs += sorted(folders) + ([ignore] if os.path.exists(ignore) else [])
    return inputs


FAILED = "gpuenv: failed: "  # install.py's last line when a requirement cannot be installed
MISMATCH = "gpuenv: hash mismatch: "  # ... when a file's sha256 is not the lock's

# Each kind of Dockerfile a builder gets: with mounts (BuildKit, buildah), or classic.
BUILDER_KINDS: tuple[Builder, ...] = ("buildkit", "classic")
BUILD_NETWORK_ENV = "GPUENV_BUILD_NETWORK"


def build_network(env: Mapping[str, str] | None = None) -> str | None:
    """The network mode of a build's RUN steps: GPUENV_BUILD_NETWORK (`host`, to reach a
    package index on this machine's loopback), else the engine's default."""
    env = os.environ if env is None else env
    return env.get(BUILD_NETWORK_ENV) or None


@dataclass(frozen=True)
class BuildResult:
    tag: str
    built: bool  # False: the image was already there, the build API was not called
    cached_steps: int = 0
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()  # gpuenv's own, from the build (said by the view)


def build(
    plan: BuildPlan, engine: Engine, view: BuildView, *, network: str | None = None
) -> BuildResult:
    """Build the plan's image unless the engine already has its content-addressed tag;
    `network`: the network mode of its RUN steps (None: the engine's default). When the
    engine cannot use a cache mount, the image is built again without them, with a
    warning (in the progress's warnings), never a failed build."""
    if engine.has_image(plan.tag):
        return BuildResult(plan.tag, built=False)
    started = time.monotonic()
    progress = BuildProgress()
    view.build_started(plan.tag)
    _stream(engine, plan, view, progress, network)
    if progress.error and plan.uncached and cache_refused(progress):
        reason = redact(_refusal(progress.error))
        progress.retry()
        _stream(engine, plan.without_caches(), view, progress, network)
        progress.warn(
            f"the engine could not use gpuenv's dependency cache ({reason}): built without "
            "it, so this build downloaded every requirement; see "
            "docs/images.md#dependency-caches"
        )
    progress.finish()
    view.build_finished(progress)
    if progress.error or not engine.has_image(plan.tag):
        raise _build_failure(progress)
    return BuildResult(
        plan.tag, True, progress.cached_steps, time.monotonic() - started, tuple(progress.warnings)
    )


def _stream(
    engine: Engine,
    plan: BuildPlan,
    view: BuildView,
    progress: BuildProgress,
    network: str | None,
) -> None:
    events = engine.build(plan.context(), plan.tag, network=network)
    try:
        for event in events:
            lines = progress.feed(event)
            view.build_lines(progress, lines)
            if progress.error:
                break
    finally:
        events.close()  # Ctrl-C, a failed step: the request ends, and BuildKit stops


# What Podman's buildah says when it cannot make or use a cache mount's folder (on
# Podman 4.3, a rootless build after another user's: all share /var/tmp/buildah-cache).
CACHE_REFUSED = ("/buildah-cache/", "/buildah-cache:")


def _refusal(error: str) -> str:
    """The clause of buildah's error that names the cache folder: `mkdir /var/tmp/
    buildah-cache/gpuenv-python-999: permission denied`, not the whole step."""
    found = [error.find(marker) for marker in CACHE_REFUSED if marker in error]
    if not found:
        return error.strip()
    start = error.rfind(": ", 0, min(found))
    return error[start + 2 if start >= 0 else 0 :].strip()


def cache_refused(progress: BuildProgress) -> bool:
    """Whether the build failed because the engine could not use a cache mount."""
    text = "\n".join([progress.error or "", *progress.tail])
    return any(marker in text for marker in CACHE_REFUSED)


# A build step that could not reach an index or an archive (pip, uv, apt say it so).
_UNREACHED = re.compile(
    r"Temporary failure (?:in name resolution|resolving)|Could not resolve|"
    r"Name or service not known|"
    r"Network is unreachable|Connection refused|Connection timed out|Failed to establish "
    r"a new connection|dns error|Failed to fetch http",
    re.IGNORECASE,
)


def _build_failure(progress: BuildProgress) -> BuildError:
    error = redact(progress.error or "the build ended without an image")
    tail = [line for line in progress.tail if line != progress.error][-15:]
    hint = None
    text = "\n".join(tail)
    mismatch = [line.removeprefix(MISMATCH) for line in progress.tail if line.startswith(MISMATCH)]
    if mismatch:
        # install.py names the package and both hashes: the file is not the locked one.
        return BuildError(
            f"a file differs from the one gpuenv.lock pins: {redact(mismatch[-1])}",
            step=progress.step,
            hint="the index now serves other bytes under the same name (a re-upload, a "
            "mirror, tampering): find out why before anything else; `gpuenv lock "
            "--upgrade-package NAME` locks what the index serves now, if you trust it",
        )
    failed = [line.removeprefix(FAILED) for line in progress.tail if line.startswith(FAILED)]
    if failed:
        # install.py names the requirement (file:line) and the installer's own reason.
        return BuildError(
            f"a requirement could not be installed: {redact(failed[-1])}",
            step=progress.step,
            output=[line for line in tail if not line.startswith(FAILED)],
            hint="fix that requirement (its name, its version, its index), then run "
            "`gpuenv build` again",
        )
    conflicts = [
        line.removeprefix("gpuenv: conflict: ")
        for line in progress.tail
        if line.startswith("gpuenv: conflict: ")
    ]
    if conflicts:
        # install.py checked the project's pins against the image before pip ran: its
        # lines are the explanation, one per package.
        return BuildError(
            "the project's requirements conflict with the image: " + "; ".join(conflicts),
            step=progress.step,
            hint="relax those pins (or remove them: the image provides the package), or pin "
            "an image that ships what they ask for (`version:` in gpuenv.yaml)",
        )
    if "(constraint)" in text:
        hint = (
            "a requirement asks for another version of the image's own framework build; "
            "gpuenv keeps NVIDIA's build: remove that pin (e.g. torch==...) from the requirements"
        )
    elif _UNREACHED.search(text + "\n" + error):
        hint = (
            "a build step could not reach the network (a name that does not resolve, a "
            "connection refused or timed out): fix the engine host's DNS or proxy; "
            "GPUENV_BUILD_NETWORK=host runs build steps on the engine host's own network"
        )
    elif "pip-install.sh" in (progress.step or ""):
        hint = "fix the requirement pip could not install, then run `gpuenv build` again"
    elif "apt-install.sh" in (progress.step or ""):
        hint = "check the Debian/Ubuntu package names in `apt:` for the image's release"
    return BuildError(
        f"build failed at {progress.step or 'the start'}: {error}",
        step=progress.step,
        output=tail,
        hint=hint,
    )


def push(
    project: Project,
    engine: Engine,
    view: View,
    mirror: str | None,
    repository: str,
    platform: str | None = None,
    bake_policy: BakePolicy | None = None,
    notice: Callable[[str], None] = lambda _: None,
) -> tuple[Project, str]:
    """Build the project image with the code baked in (checked first: no credentials,
    not too big; `notice` gets its size), push it, record its digest (and the platform
    it was built for) in the lock (`pushed`), and return the image by digest."""
    reference = parse_reference(repository)
    if reference.digest:
        raise PullError(f"{repository}: name a repository (and a tag), not a digest")
    baked = plan(project, mirror, bake=True).files
    notice(check_bake(baked, bake_policy or BakePolicy()).describe())
    project, _ = ensure_base(project, engine, view, mirror)
    planned = plan(project, mirror, bake=True, builder=engine.builder)
    result = build(planned, engine, view, network=build_network())
    tag = reference.tag or result.tag.rsplit(":", 1)[1]
    engine.tag(result.tag, reference.repository, tag)
    target = f"{reference.repository}:{tag}"
    digest = with_retries(
        lambda: _pushed_digest(engine, reference.repository, tag, target), f"push of {target}"
    )
    if digest is None:
        raise PullError(f"the registry did not report a digest for {target}")
    pushed = {"reference": target, "digest": digest, "image": f"{reference.repository}@{digest}"}
    if platform:
        pushed["platform"] = platform
    lock = replace(project.lock, extra={**project.lock.extra, "pushed": pushed})
    with exclusive(project.lock_path):
        write_lock(project.lock_path, lock)
    return Project(project.spec, lock, project.lock_path), pushed["image"]


def _pushed_digest(engine: Engine, repository: str, tag: str, target: str) -> str | None:
    """Push `repository:tag`; the digest the registry reports, or None."""
    digest = None
    for event in engine.push(repository, tag, auth_for(repository)):
        if "error" in event:
            raise pull_error(target, str(event.get("error")), verb="push")
        aux = event.get("aux")
        if isinstance(aux, dict) and str(aux.get("Digest", "")).startswith("sha256:"):
            digest = str(aux["Digest"])
    return digest
