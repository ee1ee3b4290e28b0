"""gpuenv ps, stop, logs, attach, wait, rm: the runs on this host (`app.runs`)."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from gpuenv.app import runs
from gpuenv.cli import output, ui
from gpuenv.cli.base import report
from gpuenv.cli.context import Application
from gpuenv.cli.views import health_lines, runs_table
from gpuenv.errors import GpuenvError


@click.command()
@click.option(
    "-a",
    "--all",
    "show_all",
    is_flag=True,
    help="Also runs that have stopped but not been removed (as `docker ps -a`).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
@click.pass_obj
def ps(app: Application, show_all: bool, as_json: bool) -> None:
    """List the gpuenv runs on this host: project, user, GPUs, command, image, uptime,
    and the health of the GPUs each one holds (a throttled or failing GPU slows or
    breaks the run on it; `gpuenv top` shows every GPU), and whether each is detached
    (`gpuenv run -d`). --all adds ended detached runs."""
    listed = runs.list_on_host(app.engine(), show_all=show_all)
    health = listed.health
    if as_json:
        output.data([{**r.to_data(), "health": health[r.id]} for r in listed.runs])
    elif not listed.runs:
        ui.info("no gpuenv runs on this host")
    else:
        ui.table(runs_table(listed.runs))
        # Findings are messages, not rows: on stderr, so a piped table stays plain rows.
        for run in listed.runs:
            for line in health_lines(health[run.id]):
                ui.err.print(f"{ui.cell(run.name)}: {line}")


@click.command()
@click.argument("run_name", metavar="RUN")
@click.pass_obj
def stop(app: Application, run_name: str) -> None:
    """Stop a gpuenv run (by name or id, as `gpuenv ps` shows): its owner, or root.

    The run's command gets SIGTERM, then SIGKILL after 10 s; its gpuenv process then
    removes the container and releases its GPUs. A detached run's GPUs are free once it
    has stopped; its container stays (`gpuenv logs`, `gpuenv rm`).
    """
    run, ended = runs.stop(app.engine(), run_name, os.getuid())
    if ended:
        ui.info(
            f"{run.name} has already ended ({run.state}): nothing to stop; `gpuenv logs "
            f"{run.name}` shows its output, `gpuenv rm {run.name}` removes it"
        )
        return
    ui.success(f"stopped {run.name} ({run.project}, {run.user})")


def _write(kind: int, data: bytes) -> None:
    stream = sys.stderr.buffer if kind == 2 else sys.stdout.buffer
    stream.write(data)
    stream.flush()


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Go on printing output as it comes.")
@click.option("--tail", default="all", metavar="N", help="Only the last N lines (default: all).")
@click.argument("run_name", metavar="RUN")
@click.pass_obj
def logs(app: Application, run_name: str, follow: bool, tail: str) -> None:
    """Print a run's output (stdout and stderr, as it wrote them): its owner, or root.
    With -f, follow it until the run ends (Ctrl-C stops following, not the run)."""
    if tail != "all" and not tail.isdigit():
        raise click.BadParameter("a number of lines, or all", param_hint="--tail")
    with contextlib.suppress(KeyboardInterrupt):
        runs.logs(app.engine(), run_name, os.getuid(), follow=follow, tail=tail, write=_write)


@click.command()
@click.argument("run_name", metavar="RUN")
@click.pass_obj
def attach(app: Application, run_name: str) -> None:
    """Follow a running run's output from now on, and exit with its exit code when it
    ends. Ctrl-C detaches: the run goes on. Its owner, or root."""
    code = runs.attach(
        app.engine(),
        run_name,
        os.getuid(),
        write=_write,
        notice=lambda text: click.echo(f"gpuenv: {text}", err=True),
    )
    sys.exit(0 if code is None else code)


@click.command(name="wait")
@click.argument("run_name", metavar="RUN")
@click.pass_obj
def wait_command(app: Application, run_name: str) -> None:
    """Wait until a run ends, and exit with its command's exit code."""
    sys.exit(runs.wait(app.engine(), run_name))


@click.command()
@click.argument("run_names", metavar="RUN...", nargs=-1, required=True)
@click.pass_obj
def rm(app: Application, run_names: tuple[str, ...]) -> None:
    """Remove detached runs that have ended, with their output: their owner, or root.

    Several may be named (`gpuenv rm a b c`, as `docker rm`): each is removed or its
    error said, and the exit code is the first error's. Each end goes into the GPU-hours
    records (`gpuenv usage`)."""
    failed: GpuenvError | None = None
    for _, outcome in runs.remove(app.engine(), run_names, os.getuid(), ui.warn):
        if isinstance(outcome, GpuenvError):
            if len(run_names) == 1:
                raise outcome
            report(outcome)
            failed = failed or outcome
            continue
        ui.success(f"removed {outcome.name}")
    if failed is not None:
        raise click.exceptions.Exit(failed.exit_code)
