"""gpuenv submit, jobs, export: the locked environment on Slurm and other schedulers."""

from __future__ import annotations

import shlex
from typing import Any

import click
import yaml

from gpuenv.app.export import (
    ComposeRequest,
    KubernetesRequest,
    compose_export,
    kubernetes_export,
    write_pylock,
)
from gpuenv.app.overlay import pylock_text
from gpuenv.app.submit import JobRequest, list_jobs, submit_job
from gpuenv.cli import output, ui
from gpuenv.cli.context import Application, apply, view_factory
from gpuenv.cli.devcontainer import export_devcontainer_command

count_option = click.option(
    "--gpus",
    type=click.IntRange(min=0),
    help="GPUs per job (default: the spec's count, or 1).",
)


def _compose_gpus(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    """`--gpus 2` (a count) or `--gpus 0,2` (device ids, as Compose's device_ids)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return int(text)
    ids = [part.strip() for part in text.split(",")]
    if not all(ids) or len(set(ids)) != len(ids):
        raise click.BadParameter(f"{value!r}: a count (2) or device ids (0,2 or GPU-…)")
    return tuple(ids)


compose_gpus_option = click.option(
    "--gpus",
    callback=_compose_gpus,
    metavar="N|IDS",
    help="GPUs: a count (2), or device ids as `0,2` or GPU UUIDs (Compose's device_ids); "
    "default: the spec's.",
)
cluster_options = apply(
    [
        click.option(
            "-e", "--env", multiple=True, metavar="KEY[=VALUE]", help="A variable for the job."
        ),
        click.option("--env-file", "env_files", multiple=True, type=click.Path(dir_okay=False)),
    ]
)
target_argument = click.argument(
    "arguments", nargs=-1, type=click.UNPROCESSED, required=True, metavar="TARGET [ARGS]..."
)
PASS_THROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False}
rendezvous_option = click.option(
    "--rendezvous-timeout",
    type=click.IntRange(min=1),
    default=600,
    show_default=True,
    metavar="SECONDS",
    help="With several nodes: torchrun fails when not every node joined within this.",
)


@click.command(context_settings=PASS_THROUGH)
@count_option
@cluster_options
@click.option("--time", "time_limit", metavar="TIME", help="Slurm time limit, e.g. 04:00:00.")
@click.option("--partition", help="Slurm partition.")
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    help="Number of nodes; more than one runs one torchrun per node (c10d rendezvous).",
)
@click.option(
    "--sbatch-arg",
    "sbatch_args",
    multiple=True,
    metavar="--OPTION=VALUE",
    help="Any other sbatch option (repeatable).",
)
@click.option(
    "--launcher",
    type=click.Choice(["docker", "pyxis", "apptainer"]),
    default="docker",
    show_default=True,
    help="docker run on the node, srun with pyxis/enroot, or apptainer exec of a SIF.",
)
@click.option(
    "--sif-cache",
    metavar="DIR",
    envvar="GPUENV_SIF_CACHE",
    help="Apptainer: the folder of SIF files, by digest, on a file system every node "
    "sees (default: $GPUENV_SIF_CACHE, else sif/ in gpuenv's cache folder, "
    "~/.cache/gpuenv/sif).",
)
@rendezvous_option
@click.option("--dry-run", is_flag=True, help="Print the sbatch script; submit nothing.")
@target_argument
@click.pass_obj
def submit(
    obj: Application,
    gpus: int | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    time_limit: str | None,
    partition: str | None,
    nodes: int | None,
    sbatch_args: tuple[str, ...],
    launcher: str,
    sif_cache: str | None,
    rendezvous_timeout: int,
    dry_run: bool,
    arguments: tuple[str, ...],
) -> None:
    """Submit TARGET to Slurm, in the locked image (by the digest `gpuenv push` recorded).

    The job asks for --gres=gpu:N (per node); its step runs the image with exactly the
    GPUs Slurm granted, the project mounted at /workspace, as you, and passes the exit
    code back to Slurm. With --nodes N (N > 1), one torchrun per node meets the others in
    a c10d rendezvous on the first node. The script and the job's output go to
    .gpuenv/slurm/ in the project (0600 files in a 0700 folder). -e and --env-file values
    are never written: the script names each variable, and its value reaches the job
    through sbatch's environment.
    """
    request = JobRequest(
        arguments,
        gpus=gpus,
        env=env,
        env_files=env_files,
        time_limit=time_limit,
        partition=partition,
        sbatch_args=sbatch_args,
        launcher=launcher,
        nodes=nodes,
        rendezvous_timeout=rendezvous_timeout,
        sif_cache=sif_cache,
    )
    submission = submit_job(obj.directory, request, ui.warn, obj.engine, dry_run=dry_run)
    submitted = submission.submitted
    if submitted is None:  # --dry-run
        click.echo(submission.script, nl=False)
        return
    output.result(submitted.job)
    ui.success(f"submitted job {submitted.job} ({submitted.script}); `gpuenv jobs` follows it")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@click.pass_obj
def jobs(obj: Application, as_json: bool) -> None:
    """This project's Slurm jobs: pending, running, ended (sacct).

    Pending and running jobs come from squeue; those that ended in the last 7 days from
    sacct, where the cluster keeps Slurm accounting (gpuenv says so where it does not)."""
    listed = list_jobs(obj.directory)
    if as_json:
        output.data(listed.rows)
    elif not listed.rows:
        ui.info(f"no jobs named {listed.name}")
    else:
        for job in listed.rows:
            code = f"  exit {job['exit_code']}" if job.get("exit_code") else ""
            ui.out.print(
                f"{job['job']:>8}  {job['state']:<10} {job['time']:>10}  {job['where']}{code}",
                markup=False,
            )
    if listed.not_shown is not None:
        ui.info(f"jobs that ended are not shown: {listed.not_shown}")


write_values_option = click.option(
    "--write-values",
    is_flag=True,
    help="Write the values of -e KEY=VALUE and --env-file into the file. Without it, "
    "the file only names those variables: exported files end up in logs and commits.",
)


def _say_where_values_come_from(referenced: list[str], where: str) -> None:
    """Tell (on stderr, names only) which variables the file names without a value."""
    if referenced:
        ui.info(f"{', '.join(referenced)}: no value written; {where}")


@click.group()
def export() -> None:
    """Write the locked environment for another scheduler (to stdout), or for an
    editor (`export devcontainer`: .devcontainer/devcontainer.json).

    No value of -e or --env-file is written unless --write-values asks for it: the
    Kubernetes Job reads those variables from a Secret, the Compose service from the
    environment `docker compose` runs in. The spec's env is written as it is."""


@export.command("pylock")
@click.option(
    "-o",
    "--output",
    "target",
    type=click.Path(dir_okay=False, writable=True),
    help="Write to this file (pylock.toml, say) instead of stdout.",
)
@click.pass_obj
def export_pylock(obj: Application, target: str | None) -> None:
    """The Python packages gpuenv.lock pins, as a PEP 751 pylock.toml.

    Every package gpuenv installs on the base image, with its version, index, file URL
    and sha256, for pip (`pip install --no-deps -r pylock.toml`, pip 26.1 and later),
    uv (`uv pip install -r pylock.toml`) and security scanners. The base image's own
    packages are not in it: its digest is, under [tool.gpuenv]. Exit 5 when the lock's
    packages are not resolved (run `gpuenv lock`)."""
    if target is None:
        click.echo(pylock_text(obj.directory), nl=False)
        return
    write_pylock(obj.directory, target)
    ui.success(f"wrote {target}")


@export.command("kubernetes", context_settings=PASS_THROUGH)
@count_option
@cluster_options
@click.option("--queue", metavar="NAME", help="Kueue LocalQueue: labelled, created suspended.")
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Pods (nodes); more than one: an Indexed Job running torchrun, a headless Service.",
)
@click.option("--mig", metavar="PROFILE", help="Ask for MIG slices, e.g. 1g.10gb, not GPUs.")
@click.option(
    "--pull-secret",
    "pull_secrets",
    multiple=True,
    metavar="NAME",
    help="An imagePullSecret for a private registry (repeatable).",
)
@click.option(
    "--env-secret",
    metavar="NAME",
    help="The Secret the Job reads -e and --env-file variables from, a key per variable "
    "(default: gpuenv-PROJECT-env).",
)
@write_values_option
@rendezvous_option
@target_argument
@click.pass_obj
def export_kubernetes(
    obj: Application,
    gpus: int | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    queue: str | None,
    nodes: int,
    mig: str | None,
    pull_secrets: tuple[str, ...],
    env_secret: str | None,
    write_values: bool,
    rendezvous_timeout: int,
    arguments: tuple[str, ...],
) -> None:
    """A Kubernetes Job running TARGET in the pushed image (by digest), with nvidia.com/gpu
    (or MIG) limits, /dev/shm as a memory-backed emptyDir, a non-root user and no
    restarts; with --nodes N, an Indexed Job of N pods and its headless Service.
    Variables of -e and --env-file come from a Secret (--env-secret), not the file."""
    request = KubernetesRequest(
        arguments,
        env,
        env_files,
        write_values,
        gpus=gpus,
        queue=queue,
        nodes=nodes,
        mig=mig,
        pull_secrets=pull_secrets,
        env_secret=env_secret,
        rendezvous_timeout=rendezvous_timeout,
    )
    exported = kubernetes_export(obj.directory, request, obj.engine, notice=ui.warn)
    secret = shlex.quote(exported.secret)
    _say_where_values_come_from(
        exported.referenced,
        f"the Job reads them from the Secret {secret}: `kubectl create secret generic "
        f"{secret} --from-env-file=FILE` (or --from-literal=KEY=VALUE) makes it",
    )
    click.echo(yaml.safe_dump_all(exported.manifests, sort_keys=False), nl=False)


@export.command("compose", context_settings=PASS_THROUGH)
@compose_gpus_option
@cluster_options
@click.option(
    "--mount",
    "mounts",
    multiple=True,
    metavar="SRC:DST[:ro|rw]",
    help="Another volume, as for `gpuenv run --mount`.",
)
@click.option(
    "--allow-mount",
    "allow_mounts",
    multiple=True,
    metavar="PATH",
    help="Let a mount of exactly PATH through, as for `gpuenv run --allow-mount`.",
)
@write_values_option
@target_argument
@click.pass_obj
def export_compose(
    obj: Application,
    gpus: int | tuple[str, ...] | None,
    env: tuple[str, ...],
    env_files: tuple[str, ...],
    mounts: tuple[str, ...],
    allow_mounts: tuple[str, ...],
    write_values: bool,
    arguments: tuple[str, ...],
) -> None:
    """A docker-compose.yaml service running TARGET in the project image: the pushed
    digest, or else the locally built tag; GPUs reserved by count or device ids. The
    spec's mounts go in as `gpuenv run` would bind them (only paths inside the project,
    unless the user config or --mount allows more; read-only outside the project).
    Variables of -e and --env-file are named without a value: Compose takes them from
    the environment it runs in."""
    request = ComposeRequest(
        arguments,
        env,
        env_files,
        write_values,
        gpus=gpus,
        mounts=mounts,
        allow_mounts=allow_mounts,
    )
    exported = compose_export(
        obj.directory, request, obj.engine, view_factory(True), notice=ui.warn
    )
    _say_where_values_come_from(
        exported.referenced,
        "Compose takes them from the environment `docker compose` runs in (export them "
        "there; one it lacks is unset in the container)",
    )
    click.echo(yaml.safe_dump(exported.manifest, sort_keys=False), nl=False)


export.add_command(export_devcontainer_command)
