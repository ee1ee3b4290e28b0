"""gpuenv run, shell, ps, stop: the project's container, and the runs on this host."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gpuenv.cli.app import Context, apply, engine, quiet_option

if TYPE_CHECKING:
    from gpuenv.sharing.monitor import RunInfo

F = TypeVar("F", bound=Callable[..., Any])

run_options = apply(
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
)


def _launch(obj: Context, quiet: bool, **options: Any) -> None:
    from gpuenv.cli.running import launch_run

    launch_run(obj.directory, quiet, **options)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@run_options
@click.argument(
    "arguments", nargs=-1, type=click.UNPROCESSED, required=True, metavar="TARGET [ARGS]..."
)
@click.pass_obj
def run(obj: Context, /, arguments: tuple[str, ...], quiet: bool, **options: Any) -> None:
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
    _launch(obj, quiet, arguments=arguments, **options)


@click.command()
@run_options
@click.pass_obj
def shell(obj: Context, /, quiet: bool, **options: Any) -> None:
    """Open an interactive shell (bash -l) in the project's container, set up as for run."""
    _launch(obj, quiet, shell=True, **options)


def _runs(show_all: bool) -> list[RunInfo]:
    from gpuenv.sharing.monitor import list_runs

    return list_runs(engine(), show_all=show_all)


@click.command()
@click.option(
    "--all", "show_all", is_flag=True, help="Also runs that have stopped but not been removed."
)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
def ps(show_all: bool, as_json: bool) -> None:
    """List the gpuenv runs on this host: project, user, GPUs, command, image, uptime."""
    from gpuenv.cli import ui
    from gpuenv.cli.views import runs_table

    runs = _runs(show_all)
    if as_json:
        ui.data([r.to_data() for r in runs])
    elif not runs:
        ui.info("no gpuenv runs on this host")
    else:
        ui.out.print(runs_table(runs))


@click.command()
@click.argument("run_name", metavar="RUN")
def stop(run_name: str) -> None:
    """Stop a gpuenv run (by name or id, as `gpuenv ps` shows): its owner, or root.

    The run's command gets SIGTERM, then SIGKILL after 10 s; its gpuenv process then
    removes the container and releases its GPUs.
    """
    from gpuenv.cli import ui
    from gpuenv.sharing.monitor import stop_run

    run = stop_run(engine(), _runs(True), run_name, os.getuid())
    ui.success(f"stopped {run.name} ({run.project}, {run.user})")
