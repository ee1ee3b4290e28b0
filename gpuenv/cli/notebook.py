"""gpuenv notebook: JupyterLab in the project's locked image, as a run."""

from __future__ import annotations

import os
from typing import Any

import click

from gpuenv.app.notebook import notebook_options
from gpuenv.cli.context import Application
from gpuenv.cli.run import launch_run, run_options


@click.command()
@run_options
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="The port on 127.0.0.1 it listens on; 0 takes a free one.",
)
@click.option(
    "-d",
    "--detach",
    is_flag=True,
    help="Start it and return: it holds its GPUs until `gpuenv stop` (the idle policy "
    "sees it like any run).",
)
@click.option("--name", metavar="NAME", help="Name the detached notebook (gpuenv ps shows it).")
@click.pass_obj
def notebook(obj: Application, /, quiet: bool, port: int, **options: Any) -> None:
    """Start JupyterLab in the project's container, set up as for run: as you, the
    project at /workspace, the GPUs the spec (or --gpus) asks for, claimed like a run's
    (--wait queues for them).

    It listens on 127.0.0.1 only, with a token of its own: gpuenv prints the URL to
    open, and, when gpuenv runs over SSH, the `ssh -L` line that brings it to your
    computer. The image must have JupyterLab (NGC's framework images do); where it has
    not, gpuenv says which line to add to gpuenv.yaml and installs nothing itself.
    Ctrl-C stops it and frees the GPUs; with -d it runs until `gpuenv stop`.

    \b
    Examples:
      gpuenv notebook
      gpuenv notebook --gpus 1 --port 8888
      gpuenv notebook -d --name lab && gpuenv ps
    """
    launch_run(
        obj,
        quiet,
        workdir=obj.subfolder,
        **notebook_options(options, port, os.environ, os.getuid()),
    )
