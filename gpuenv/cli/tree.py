"""The click command tree of `gpuenv` (`gpuenv.cli.tree.main`).

The tree is loaded lazily (one module per command group): `gpuenv --version` imports
none of them, and `gpuenv run` only the run commands.
"""

from __future__ import annotations

import click

from gpuenv import __version__
from gpuenv.app.folders import project_folder
from gpuenv.cli.context import Application, LazyGroup
from gpuenv.errors import exit_codes_help

COMMANDS = {
    "init": "gpuenv.cli.project.init",
    "resolve": "gpuenv.cli.resolve.resolve",
    "lock": "gpuenv.cli.project.lock",
    "check": "gpuenv.cli.project.check",
    "matrix": "gpuenv.cli.matrix.matrix",
    "render": "gpuenv.cli.images.render",
    "pull": "gpuenv.cli.images.pull",
    "build": "gpuenv.cli.build.build",
    "images": "gpuenv.cli.images.images",
    "gc": "gpuenv.cli.images.gc",
    "push": "gpuenv.cli.images.push",
    "run": "gpuenv.cli.run.run",
    "shell": "gpuenv.cli.run.shell",
    "notebook": "gpuenv.cli.notebook.notebook",
    "ps": "gpuenv.cli.ps.ps",
    "stop": "gpuenv.cli.ps.stop",
    "logs": "gpuenv.cli.ps.logs",
    "attach": "gpuenv.cli.ps.attach",
    "wait": "gpuenv.cli.ps.wait_command",
    "rm": "gpuenv.cli.ps.rm",
    "top": "gpuenv.cli.monitoring.top",
    "doctor": "gpuenv.cli.monitoring.doctor",
    "exporter": "gpuenv.cli.exporter.exporter",
    "dashboard": "gpuenv.cli.dashboard.dashboard",
    "usage": "gpuenv.cli.usage.usage",
    "idle": "gpuenv.cli.monitoring.idle",
    "submit": "gpuenv.cli.cluster.submit",
    "jobs": "gpuenv.cli.cluster.jobs",
    "export": "gpuenv.cli.cluster.export",
    "devcontainer-claim": "gpuenv.cli.devcontainer.devcontainer_claim",
}


@click.group(
    cls=LazyGroup,
    lazy_subcommands=COMMANDS,
    epilog=exit_codes_help(),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", "-V", prog_name="gpuenv")
@click.option(
    "-C",
    "--directory",
    # Not `readable`: a folder you may enter but not list still has files gpuenv can read.
    type=click.Path(file_okay=False, exists=True, readable=False),
    default=".",
    help="Run as if gpuenv was started in this project folder.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (for bug reports).")
@click.pass_context
def main(ctx: click.Context, directory: str, debug: bool) -> None:
    """gpuenv: one spec per project for GPU containers.

    gpuenv.yaml says what the project needs; gpuenv resolves it against NVIDIA's NGC
    images, the CUDA/driver rules and this host's GPUs, and pins the answer in
    gpuenv.lock for everyone on the team.

    \b
    Start:   gpuenv init            write gpuenv.yaml and gpuenv.lock
    Plan:    gpuenv resolve --explain
    Pin:     gpuenv lock            (--check in CI, --upgrade to move on)
    Image:   gpuenv build           (pulls the base, pins its digest, builds)
    Run:     gpuenv run train.py    (as you, the project at /workspace)
    Share:   gpuenv ps | top | stop (who uses which GPU)
    Watch:   gpuenv dashboard | exporter | usage (a web page, Prometheus, GPU-hours)
    Detach:  gpuenv run -d | logs -f | attach | wait | rm
    Work:    gpuenv shell | notebook | export devcontainer (editors)
    Scale:   gpuenv push | submit | jobs | export kubernetes|compose
    Fix:     gpuenv doctor
    Check:   gpuenv check
    Data:    gpuenv matrix pytorch
    Script:  --json on check, lock, init, resolve, matrix, doctor, ps, top,
             images, jobs (failures too); piped tables are tab-separated
    """
    given = ctx.get_parameter_source("directory") is not click.core.ParameterSource.DEFAULT
    search = not given and ctx.invoked_subcommand != "init"
    folder, subfolder = project_folder(directory, search=search)
    passed = ctx.obj if isinstance(ctx.obj, Application) else Application()  # a test's engine
    ctx.obj = Application(folder, debug, subfolder, connected=passed.connected)


if __name__ == "__main__":  # pragma: no cover
    main()
