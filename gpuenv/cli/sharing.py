"""gpuenv top and doctor: the GPUs of a shared host, and whether it is ready."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from gpuenv.cli.app import Context, engine

if TYPE_CHECKING:
    from gpuenv.resolution.host import Host
    from gpuenv.sharing.monitor import GpuRow


def _top_data() -> tuple[Host, list[GpuRow]]:
    from gpuenv.resolution.host import detect_host
    from gpuenv.sharing.claims import ClaimStore
    from gpuenv.sharing.monitor import gpu_rows, list_runs

    host = detect_host()
    if not host.gpus:
        return host, []
    try:
        claims = ClaimStore().claims()
    except Exception:  # a read-only or missing state folder: show the GPUs anyway
        claims = []
    return host, gpu_rows(host, claims, list_runs(engine()))


@click.command()
@click.option("--once", is_flag=True, help="Print one snapshot and exit.")
@click.option("--json", "as_json", is_flag=True, help="One snapshot as JSON (implies --once).")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes.")
def top(once: bool, as_json: bool, interval: float) -> None:
    """A live view of every GPU: utilization, memory, temperature, power, and which run,
    container and user holds it (NVML's process IDs mapped to containers through their
    cgroups). GPUs used by processes outside gpuenv are shown as such."""
    import time

    from gpuenv.cli import ui
    from gpuenv.cli.views import top_table

    host, rows = _top_data()
    if not host.gpus:
        message = f"no NVIDIA GPU on this host ({host.note or host.describe()}): nothing to show"
        if as_json:
            ui.data({"host": host.to_data(), "gpus": [], "message": message})
        else:
            ui.info(message)
        return
    if as_json:
        summary = {k: v for k, v in host.to_data().items() if k != "gpus"}
        ui.data({"host": summary, "gpus": [r.to_data() for r in rows]})
        return
    if once:
        ui.out.print(top_table(host, rows))
        return
    from rich.live import Live

    with Live(top_table(host, rows), console=ui.out, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                host, rows = _top_data()
                live.update(top_table(host, rows), refresh=True)
        except KeyboardInterrupt:
            pass


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.pass_obj
def doctor(obj: Context, as_json: bool) -> None:
    """Check this machine for gpuenv: the engine (Docker or Podman, rootless or not) and
    its API, the GPU path (legacy NVIDIA request or CDI, and what is wrong with the CDI
    specs: a cdiVersion the engine cannot read, a spec stale after a driver upgrade),
    the NVIDIA runtime, driver and NVML, the project's lock against this host, free disk,
    nvcr.io credentials and the state folder. Exits 15 when a check fails."""
    from rich.markup import escape

    from gpuenv.cli import ui
    from gpuenv.errors import EXIT_DOCTOR
    from gpuenv.run.doctor import run_checks

    checks = run_checks(obj.directory, engine)
    if as_json:
        ui.data([c.to_data() for c in checks])
    else:
        marks = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}
        for check in checks:
            ui.out.print(f"{marks[check.status]} {escape(check.name)}: {escape(check.detail)}")
            if check.remedy:
                ui.out.print(f"       [cyan]→[/] {escape(check.remedy)}")
    if any(c.status == "fail" for c in checks):
        sys.exit(EXIT_DOCTOR)
