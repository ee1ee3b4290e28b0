"""`gpuenv export pylock`, `export kubernetes` and `export compose`: the locked environment
written for pip and scanners, a Kubernetes cluster or `docker compose`, as data the CLI
prints. No value of -e or --env-file is written unless the request asks for it: the file
names those variables, and the scheduler fills them (a Secret, Compose's environment)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuenv.app.build import pushed_is_stale
from gpuenv.app.image import image_for_run
from gpuenv.app.overlay import pylock_text
from gpuenv.app.platforms import engine_platform
from gpuenv.app.submit import STALE_PUSH, pushed_platform
from gpuenv.app.variables import expanded_spec
from gpuenv.cluster.manifests import (
    KubernetesOptions,
    compose_file,
    env_secret,
    kubernetes_manifests,
)
from gpuenv.cluster.slurm import DEFAULT_RENDEZVOUS_TIMEOUT, pushed_image
from gpuenv.cluster.submit import exported_environment, job_gpus
from gpuenv.common.files import atomic_write
from gpuenv.containers.config import DEFAULT_SHM, command_for, shm_size
from gpuenv.engine.protocol import Engine
from gpuenv.images.progress import ViewFactory
from gpuenv.lock.project import load_project
from gpuenv.project.mounts import run_binds
from gpuenv.project.spec import Spec


def write_pylock(directory: str, target: str) -> None:
    """Write the lock's packages as pylock.toml to `target` (whole, or not at all);
    LockError (exit 5) while they are not locked for the requirements as they are."""
    atomic_write(target, pylock_text(directory))


@dataclass(frozen=True)
class ExportRequest:
    """What an export was asked for on the command line: the target and its arguments,
    the variables of -e and --env-file, and whether their values go into the file."""

    arguments: tuple[str, ...]
    env: tuple[str, ...] = ()
    env_files: tuple[str, ...] = ()
    write_values: bool = False


@dataclass(frozen=True)
class KubernetesRequest(ExportRequest):
    """`export kubernetes`'s request: GPUs per pod (None: the spec's), and what the
    cluster asks of the Job (queue, nodes, MIG profile, pull secrets, the Secret of the
    variables, the rendezvous timeout)."""

    gpus: int | None = None
    queue: str | None = None
    nodes: int = 1
    mig: str | None = None
    pull_secrets: tuple[str, ...] = ()
    env_secret: str | None = None
    rendezvous_timeout: int = DEFAULT_RENDEZVOUS_TIMEOUT


@dataclass(frozen=True)
class ComposeRequest(ExportRequest):
    """`export compose`'s request: GPUs as a count or device ids (None: the spec's), and
    the mounts (and exact paths let through) as for `gpuenv run`."""

    gpus: int | tuple[str, ...] | None = None
    mounts: tuple[str, ...] = ()
    allow_mounts: tuple[str, ...] = ()


@dataclass(frozen=True)
class KubernetesExport:
    """The Kubernetes documents (a Job, or an Indexed Job and its headless Service), the
    variables they name without a value, and the Secret the Job reads those from."""

    manifests: list[dict[str, Any]]
    referenced: list[str]
    secret: str


@dataclass(frozen=True)
class ComposeExport:
    """The docker-compose.yaml file, and the variables it names without a value."""

    manifest: dict[str, Any]
    referenced: list[str]


def kubernetes_export(
    directory: str,
    request: KubernetesRequest,
    engine: Callable[[], Engine],
    notice: Callable[[str], None],
) -> KubernetesExport:
    """The Kubernetes Job running the request's target in the pushed image (by digest);
    `notice` is told when the project changed since that push. UsageError before any
    `gpuenv push`, or for an option Kubernetes would refuse. The engine is asked for the
    image's environment only when the spec's env refers to it."""
    project = load_project(directory)
    image = pushed_image(project.lock.extra)
    spec = expanded_spec(project.spec, image, engine)
    variables = exported_environment(
        spec, request.env, request.env_files, write_values=request.write_values
    )
    options = KubernetesOptions(
        request.queue,
        request.nodes,
        request.mig,
        request.pull_secrets,
        request.rendezvous_timeout,
        request.env_secret,
    )
    if pushed_is_stale(project):
        notice(STALE_PUSH)
    manifests = kubernetes_manifests(
        spec,
        image,
        command_for(request.arguments),
        variables.written,
        gpus=job_gpus(project.spec, request.gpus),
        shm_size=shm_size(project.spec) or DEFAULT_SHM,
        uid=os.getuid(),
        gid=os.getgid(),
        platform=pushed_platform(project),
        options=options,
        referenced=variables.referenced,
    )
    secret = request.env_secret or env_secret(project.spec)
    return KubernetesExport(manifests, variables.referenced, secret)


def compose_export(
    directory: str,
    request: ComposeRequest,
    engine: Callable[[], Engine],
    view: ViewFactory,
    notice: Callable[[str], None],
) -> ComposeExport:
    """The Compose service running the request's target in the pushed image, or else the
    project image built here (built first when missing, shown by `view`); the spec's
    mounts as `gpuenv run` would bind them (`notice` is told of one left out)."""
    project = load_project(directory)
    binds = run_binds(
        project.spec, request.mounts, request.allow_mounts, env=os.environ, notice=notice
    )
    image = (project.lock.extra.get("pushed") or {}).get("image")
    platform = pushed_platform(project)
    if not image:
        connected = engine()
        image = image_for_run(directory, connected, view).tag
        platform = engine_platform(connected)
    spec = expanded_spec(project.spec, image, engine)
    variables = exported_environment(
        spec, request.env, request.env_files, write_values=request.write_values
    )
    gpus, devices = _compose_gpus(project.spec, request.gpus)
    manifest = compose_file(
        project.spec,
        image,
        command_for(request.arguments),
        variables.written,
        gpus=gpus,
        device_ids=devices,
        shm_size=shm_size(project.spec) or DEFAULT_SHM,
        uid=os.getuid(),
        gid=os.getgid(),
        platform=platform,
        binds=binds,
        referenced=variables.referenced,
    )
    return ComposeExport(manifest, variables.referenced)


def _compose_gpus(spec: Spec, gpus: int | tuple[str, ...] | None) -> tuple[int | None, list[str]]:
    """The service's GPUs as (count, device ids), one of them given: the device ids
    asked for, else the spec's when it names devices and no count is asked, else the
    count (asked, or the spec's)."""
    if isinstance(gpus, tuple):
        devices, count = list(gpus), None
    else:
        request = spec.gpus
        devices = list(request.devices) if request.mode == "devices" and gpus is None else []
        count = gpus
    return (None if devices else job_gpus(spec, count)), devices
