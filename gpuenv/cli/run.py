"""gpuenv run and shell: the project's container, as a local process."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpuenv.app.launch import RunRequest, Terminal, host_services, launch, oom_advice
from gpuenv.cli.base import say, view_factory
from gpuenv.cli.context import Application, apply, freshness, freshness_options, quiet_option

F = TypeVar("F", bound=Callable[..., Any])

run_options = apply(
    [
        click.option(
            "--gpus",
            metavar="GPUS",
            help="all | none | optional | N | 0,2 | device=0 | GPU-<uuid>,... | MIG-<uuid>,... | "
            "mig=PROFILE[,count=N] (default: the spec's gpus).",
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
        click.option(
            "--mount",
            "mounts",
            multiple=True,
            metavar="SRC:DST[:ro|rw]",
            help="Bind a host path at DST: read-only outside the project unless :rw. "
            "Unlike the spec's mounts, it may be outside the project.",
        ),
        click.option(
            "--allow-mount",
            "allow_mounts",
            multiple=True,
            metavar="PATH",
            help="Let a mount of exactly PATH through although gpuenv refuses it by "
            "default (engine sockets, /etc, /proc, /dev, credentials like ~/.ssh).",
        ),
        click.option(
            "-p",
            "--publish",
            "publish",
            multiple=True,
            metavar="[IP:][HOST:]CONTAINER",
            help="Publish a container port, on 127.0.0.1 unless IP is given (0.0.0.0: "
            "every interface); HOST 0 or none takes a free port, whose URL is printed. "
            "Adds to the spec's ports.",
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
        freshness_options,
        quiet_option,
    ]
)


def _launch(obj: Application, quiet: bool, **options: Any) -> None:
    launch_run(obj, quiet, workdir=obj.subfolder, **options)


@click.command(context_settings={"allow_interspersed_args": False})
@run_options
@click.option(
    "-d",
    "--detach",
    is_flag=True,
    help="Start the run and return once it is running; it outlives this terminal and "
    "holds its GPUs until its command ends (gpuenv logs, attach, wait, stop).",
)
@click.option(
    "--name",
    metavar="NAME",
    help="Name a detached run (default: the engine picks one, shown by gpuenv ps).",
)
@click.argument(
    "arguments", nargs=-1, type=click.UNPROCESSED, required=True, metavar="TARGET [ARGS]..."
)
@click.pass_obj
def run(obj: Application, /, arguments: tuple[str, ...], quiet: bool, **options: Any) -> None:
    """Run TARGET in the project's container: `train.py ARGS` runs python3 on it, and
    `-- CMD ARGS` any command.

    The locked image is used (built first if missing; a lock whose image no longer fits
    gpuenv.yaml stops here, pointing to `gpuenv lock`). After a requirements edit, the
    lock's Python packages are resolved again first, keeping what the edit does not move,
    and the lock is written (said; --locked refuses instead, --frozen uses the lock as
    it is). The project is mounted at /workspace, and the spec's mounts inside
    it; other paths only as your user config or --mount allows, read-only unless made
    writable, and never the deny list (engine sockets, /etc, ~/.ssh, ...) unless
    --allow-mount names the path. The command runs as you, with
    a HOME and a passwd entry, so the files it writes are yours. GPUs come from the spec
    or --gpus, by UUID where known (MIG instances by their MIG UUID, or by profile with
    --gpus mig=1g.10gb,count=2); NVIDIA_VISIBLE_DEVICES is exactly the grant. They are
    asked for the way the engine takes them: CDI devices (nvidia.com/gpu=GPU-<uuid>) on
    Podman and on Docker 25+ with CDI on and a CDI spec, the NVIDIA device request
    otherwise (GPUENV_GPU_PATH=legacy|cdi overrides; GPUENV_ENGINE=podman or a podman.sock
    in DOCKER_HOST/CONTAINER_HOST picks Podman). Shared
    memory, NGC's ulimits and an init process are set. Ctrl-C stops the command (a second
    one kills it); the container is always removed; the exit code is the command's.

    With -d the run is detached: gpuenv prints its name and returns once it runs, and
    its GPUs are held by its container (released when the command ends, however it
    ends). Its container stays after it ends, for `gpuenv logs` and `gpuenv wait`,
    until `gpuenv rm`.

    \b
    Examples:
      gpuenv run train.py --lr 3e-4
      gpuenv run --gpus 0,2 -e WANDB_API_KEY train.py
      gpuenv run -- bash -lc 'nvidia-smi && python3 -c "import torch"'
      gpuenv run -d --name long-train train.py && gpuenv logs -f long-train
      gpuenv run -d -p 6006 -- tensorboard --logdir runs --bind_all

    Options go before TARGET (or `--`): what follows is the command's, and an option
    run does not know is a usage error (exit 2), as in `docker run`.
    """
    _launch(obj, quiet, arguments=arguments, **options)


@click.command()
@run_options
@click.pass_obj
def shell(obj: Application, /, quiet: bool, **options: Any) -> None:
    """Open an interactive shell (bash -l) in the project's container, set up as for run.

    \b
    Examples:
      gpuenv shell
      gpuenv shell --gpus none
      gpuenv shell -p 8888 -e HF_TOKEN
    """
    _launch(obj, quiet, shell=True, **options)


def launch_run(app: Application, quiet: bool, **options: Any) -> None:
    """Run the request to its end and exit with the command's code; a detached run
    prints its container's name and returns."""

    def notice(text: str) -> None:
        if not quiet:
            say(f"gpuenv: {text}")

    wait, wait_timeout = options.pop("wait"), options.pop("wait_timeout")
    options["freshness"] = freshness(options.pop("locked"), options.pop("frozen"))
    request = RunRequest(wait=(wait_timeout or 0.0) if wait or wait_timeout else None, **options)
    connected = app.engine()
    outcome = launch(
        app.directory,
        request,
        connected,
        services=host_services(),
        terminal=Terminal.of_this_process(),
        environ=os.environ,
        view=view_factory(quiet),
        notice=notice,
    )
    if outcome.container:
        name = str(connected.inspect(outcome.container).get("Name", outcome.container))
        name = name.lstrip("/")
        sys.stdout.write(f"{name}\n")
        sys.stdout.flush()
        notice(f"started {name}, detached: `gpuenv logs -f {name}`, `gpuenv wait {name}`")
        return
    if outcome.oom_killed:
        say(f"gpuenv: {oom_advice(request.memory)}")
    sys.exit(outcome.exit_code)
