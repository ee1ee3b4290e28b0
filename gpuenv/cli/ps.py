"""gpuenv ps, stop, logs, attach, wait, rm: the runs on this host."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

import click

from gpuenv.cli import output, ui
from gpuenv.cli.base import report
from gpuenv.cli.context import Application
from gpuenv.cli.views import health_lines, runs_table
from gpuenv.containers.detached import attach_run, owned_run, remove_run, stream_logs, wait_run
from gpuenv.errors import GpuenvError
from gpuenv.host.detect import detect_host
from gpuenv.monitoring.idle import known_state, run_idle
from gpuenv.monitoring.monitor import (
    ENDED_STATES,
    RunInfo,
    find_run,
    list_runs,
    run_health,
    stop_run,
)
from gpuenv.monitoring.usage import UsageLog
from gpuenv.reservations.claims import ClaimStore
from gpuenv.reservations.statedir import state_dir


def _runs(app: Application, show_all: bool) -> list[RunInfo]:
    return list_runs(app.engine(), show_all=show_all)


def _with_idle(runs: list[RunInfo]) -> list[RunInfo]:
    """Each run with its GPUs' idle time, where `gpuenv idle` keeps samples."""
    try:
        store = ClaimStore()
        state = known_state(store)
        store.close()
    except GpuenvError:
        return runs
    now = time.time()
    warned = state.get("warned") or {}
    return [
        dataclasses.replace(
            r,
            idle_seconds=run_idle(state, r.gpus, now),
            idle_warned=r.id in warned or f"pid {r.pid}" in warned,
        )
        if r.state == "running"
        else r
        for r in runs
    ]


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
    runs = _with_idle(_runs(app, show_all))
    host = detect_host() if any(r.state == "running" for r in runs) else None
    health = {run.id: [f.to_data() for f in run_health(run, host)] if host else [] for run in runs}
    if as_json:
        output.data([{**r.to_data(), "health": health[r.id]} for r in runs])
    elif not runs:
        ui.info("no gpuenv runs on this host")
    else:
        ui.table(runs_table(runs))
        # Findings are messages, not rows: on stderr, so a piped table stays plain rows.
        for run in runs:
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
    run = stop_run(app.engine(), _runs(app, True), run_name, os.getuid())
    if run.state in ENDED_STATES:
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
    run = owned_run(_runs(app, True), run_name, os.getuid(), "read the output of")
    with contextlib.suppress(KeyboardInterrupt):
        stream_logs(app.engine(), run, follow=follow, tail=tail, write=_write)


@click.command()
@click.argument("run_name", metavar="RUN")
@click.pass_obj
def attach(app: Application, run_name: str) -> None:
    """Follow a running run's output from now on, and exit with its exit code when it
    ends. Ctrl-C detaches: the run goes on. Its owner, or root."""
    run = owned_run(_runs(app, True), run_name, os.getuid(), "attach to")
    code = attach_run(
        app.engine(), run, write=_write, notice=lambda text: click.echo(f"gpuenv: {text}", err=True)
    )
    sys.exit(0 if code is None else code)


@click.command(name="wait")
@click.argument("run_name", metavar="RUN")
@click.pass_obj
def wait_command(app: Application, run_name: str) -> None:
    """Wait until a run ends, and exit with its command's exit code."""
    sys.exit(wait_run(app.engine(), find_run(_runs(app, True), run_name)))


def _record_end(label: str, exit_code: int | None, end: float | None) -> None:
    """A removed detached run's end, into its owner's usage file (never stops `rm`)."""
    try:
        UsageLog(state_dir()).finish_for(label, exit_code, end)
    except (GpuenvError, OSError) as exc:
        ui.warn(f"GPU usage of the run not recorded: {getattr(exc, 'message', exc)}")


@click.command()
@click.argument("run_names", metavar="RUN...", nargs=-1, required=True)
@click.pass_obj
def rm(app: Application, run_names: tuple[str, ...]) -> None:
    """Remove detached runs that have ended, with their output: their owner, or root.

    Several may be named (`gpuenv rm a b c`, as `docker rm`): each is removed or its
    error said, and the exit code is the first error's. Each end goes into the GPU-hours
    records (`gpuenv usage`)."""
    runs, connected = _runs(app, True), app.engine()
    failed: GpuenvError | None = None
    for run_name in dict.fromkeys(run_names):
        try:
            run = owned_run(runs, run_name, os.getuid(), "remove")
            remove_run(connected, run, _record_end)
        except GpuenvError as exc:
            if len(run_names) == 1:
                raise
            report(exc)
            failed = failed or exc
            continue
        ui.success(f"removed {run.name}")
    if failed is not None:
        raise click.exceptions.Exit(failed.exit_code)
