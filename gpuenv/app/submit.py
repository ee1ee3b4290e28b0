"""`gpuenv submit`: the locked environment as a Slurm job, its script written and handed
to sbatch (the image by the digest `gpuenv push` recorded); `gpuenv jobs`: the project's
jobs, as Slurm knows them."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from gpuenv.app.build import pushed_is_stale
from gpuenv.app.variables import expanded_spec
from gpuenv.cluster.slurm import (
    DEFAULT_RENDEZVOUS_TIMEOUT,
    Launch,
    job_name,
    pushed_image,
    sbatch_script,
)
from gpuenv.cluster.submit import (
    JobEnvironment,
    Submitted,
    finished_jobs,
    job_environment,
    job_gpus,
    project_jobs,
    submit_script,
)
from gpuenv.common.dirs import user_cache_dir
from gpuenv.containers.config import DEFAULT_SHM, command_for, shm_size
from gpuenv.engine.protocol import Engine
from gpuenv.errors import UsageError
from gpuenv.lock.project import Project, load_project
from gpuenv.project.validate import load_spec

STALE_PUSH = (
    "the project changed since the last `gpuenv push`: the pushed image carries the old "
    "code and requirements; run `gpuenv push` again"
)


@dataclass(frozen=True)
class JobRequest:
    """What `gpuenv submit` was asked for on the command line: the target, the job's
    variables and Slurm options, and how the job runs the image (the launcher, its nodes,
    the rendezvous timeout and the SIF cache; None: sif/ in gpuenv's cache folder)."""

    arguments: tuple[str, ...]
    gpus: int | None = None
    env: tuple[str, ...] = ()
    env_files: tuple[str, ...] = ()
    time_limit: str | None = None
    partition: str | None = None
    sbatch_args: tuple[str, ...] = ()
    launcher: str = "docker"
    nodes: int | None = None
    rendezvous_timeout: int = DEFAULT_RENDEZVOUS_TIMEOUT
    sif_cache: str | None = None

    def launch(self) -> Launch:
        """How the job runs the image; the SIF cache as an absolute path (sif/ in gpuenv's
        cache folder unless one is given)."""
        sif = self.sif_cache or os.path.join(user_cache_dir(), "sif")
        return Launch(
            self.launcher,
            self.nodes,
            self.rendezvous_timeout,
            os.path.abspath(os.path.expanduser(sif)),
        )


@dataclass(frozen=True)
class Job:
    """A job ready for sbatch: its script and where it goes, its variables' values
    (which travel in sbatch's environment, never in a file)."""

    name: str
    script: str
    output_dir: str
    variables: JobEnvironment


def prepare_job(
    directory: str,
    request: JobRequest,
    notice: Callable[[str], None],
    engine: Callable[[], Engine],
) -> Job:
    """The job's sbatch script for the project's locked image; `notice` gets what the
    user should know (a stale push, MIG asked of a cluster in whole GPUs). The engine is
    asked for the image's environment only when the spec's env refers to it."""
    launch = request.launch()
    project = load_project(directory)
    image = pushed_image(project.lock.extra)
    spec = expanded_spec(project.spec, image, engine)
    variables = job_environment(spec, request.env, request.env_files)
    if variables.values and any(a.startswith("--export") for a in request.sbatch_args):
        raise UsageError(
            "-e KEY=VALUE and --env-file values travel in sbatch's environment, which "
            "--sbatch-arg --export=... would not pass on",
            hint="drop `--sbatch-arg --export=…` (sbatch passes the environment on by "
            "default), or drop the -e/--env-file values",
        )
    if pushed_is_stale(project):
        notice(STALE_PUSH)
    gpus = job_gpus(spec, request.gpus)
    if spec.gpus.mode == "mig" and request.gpus is None:
        notice(
            f"gpuenv.yaml asks for {spec.gpus}: the job asks Slurm for --gres=gpu:{gpus}, "
            "whole GPUs (gpuenv does not know this cluster's MIG GRES types)"
        )
    output_dir = os.path.join(directory, ".gpuenv", "slurm")
    script = sbatch_script(
        spec,
        image,
        command_for(request.arguments),
        variables.written,
        passthrough=variables.names,
        gpus=gpus,
        output_dir=output_dir,
        shm_size=shm_size(spec) or DEFAULT_SHM,
        launch=launch,
        time_limit=request.time_limit,
        partition=request.partition,
        extra=request.sbatch_args,
        platform=pushed_platform(project),
    )
    return Job(spec.name, script, output_dir, variables)


@dataclass(frozen=True)
class Submission:
    """`gpuenv submit`'s outcome: the sbatch script, and the job sbatch made of it (None
    for a dry run, which submits nothing)."""

    script: str
    submitted: Submitted | None


def submit_job(
    directory: str,
    request: JobRequest,
    notice: Callable[[str], None],
    engine: Callable[[], Engine],
    *,
    dry_run: bool = False,
) -> Submission:
    """The job's script for the project's locked image (`prepare_job`), written (0600,
    in a 0700 folder) and submitted from the project folder; with `dry_run`, only the
    script."""
    job = prepare_job(directory, request, notice, engine)
    if dry_run:
        return Submission(job.script, None)
    submitted = submit_script(directory, job.output_dir, job.name, job.script, job.variables.values)
    return Submission(job.script, submitted)


def pushed_platform(project: Project) -> str | None:
    """The platform the pushed image was built for (recorded by `gpuenv push`)."""
    platform = (project.lock.extra.get("pushed") or {}).get("platform")
    return str(platform) if platform else None


@dataclass(frozen=True)
class JobList:
    """What `gpuenv jobs` shows: the jobs' Slurm name, their rows (pending and running,
    then those that ended), and why the ended ones are missing where they are (None:
    they are in)."""

    name: str
    rows: list[dict[str, str]]
    not_shown: str | None


def list_jobs(directory: str) -> JobList:
    """The project's Slurm jobs: squeue's, then sacct's that ended in the last 7 days
    (each job once). UsageError where squeue is missing or fails; sacct missing, failing
    or keeping no accounting only leaves the ended jobs out, and says why."""
    name = job_name(load_spec(directory))
    rows = project_jobs(name)
    finished = finished_jobs(name)
    if finished.rows is None:
        return JobList(name, rows, finished.reason)
    current = {job["job"] for job in rows}
    return JobList(name, rows + [job for job in finished.rows if job["job"] not in current], None)
