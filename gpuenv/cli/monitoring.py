"""gpuenv top and doctor: the GPUs of a shared host, and whether it is ready."""

from __future__ import annotations

import math
import sys
import time

import click
from rich.live import Live

from gpuenv.app.check import check_machine
from gpuenv.app.idle import check_idle
from gpuenv.app.top import top_snapshot
from gpuenv.cli import output, ui
from gpuenv.cli.context import Application
from gpuenv.cli.views import health_lines, mig_note, top_table, top_view
from gpuenv.common.units import duration
from gpuenv.errors import EXIT_DOCTOR


def _interval(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """A refresh interval a clock can wait: finite and above zero (click's FloatRange
    lets NaN and infinity through)."""
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"{value} is not a number of seconds above 0 (try 2 or 0.5)")
    return value


@click.command()
@click.option("--once", is_flag=True, help="Print one snapshot and exit.")
@click.option("--json", "as_json", is_flag=True, help="One snapshot as JSON (implies --once).")
@click.option(
    "--interval",
    type=float,
    default=2.0,
    show_default=True,
    callback=_interval,
    help="Seconds between refreshes (above 0).",
)
@click.pass_obj
def top(app: Application, once: bool, as_json: bool, interval: float) -> None:
    """A live view of every GPU: utilization, memory, temperature, power, health, and
    which run, container and user holds it (NVML's process IDs mapped to containers
    through their cgroups). GPUs used by processes outside gpuenv are shown as such.

    Health: thermal, power-cap and hardware slowdowns, a temperature near the GPU's own
    slowdown threshold, a PCIe link below the card's width or generation, uncorrected
    ECC errors and a GPU that fell off the bus, each with what to do.

    A GPU in MIG mode lists its instances below it (GPU:MIG index, profile, memory, who
    holds each). NVML rarely reads utilization per instance: it shows n/a, never 0 %.

    Output that is not a terminal (a pipe, a file) gets one snapshot, as with --once."""
    notes: list[str] = []
    host, rows = top_snapshot(app.engine, notes)
    for note in notes:
        ui.warn(note)
    if not host.gpus:
        message = f"no NVIDIA GPU on this host ({host.note or host.describe()}): nothing to show"
        if as_json:
            output.data({"host": host.to_data(), "gpus": [], "message": message})
        else:
            ui.info(message)
        return
    if as_json:
        summary = {k: v for k, v in host.to_data().items() if k != "gpus"}
        output.data({"host": summary, "gpus": [r.to_data() for r in rows]})
        return
    if once or not ui.out.is_terminal:
        ui.table(top_table(host, rows))
        # Findings are messages, not rows: on stderr, so a piped table stays plain rows.
        for line in mig_note(rows) + health_lines([f for row in rows for f in row.health]):
            ui.err.print(line)
        return

    with Live(top_view(host, rows), console=ui.out, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                host, rows = top_snapshot(app.engine)
                live.update(top_view(host, rows), refresh=True)
        except KeyboardInterrupt:
            pass


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.pass_obj
def doctor(obj: Application, as_json: bool) -> None:
    """Check this machine for gpuenv: the engine (Docker or Podman, rootless or not) and
    its API, the GPU path (legacy NVIDIA request or CDI, and what is wrong with the CDI
    specs: a cdiVersion the engine cannot read, a spec stale after a driver upgrade),
    the NVIDIA runtime, driver and NVML, the project's lock against this host, free disk
    (room for the locked image) and the storage under it (NVMe, SSD or rotating), system
    memory against GPU memory, nvcr.io credentials, the state folder and, where one is
    set, the dcgm-exporter job mapping folder. Sizing thresholds: [sizing] in
    /etc/gpuenv/config.toml. Exits 15 when a check fails."""
    checks = check_machine(obj.directory, obj.engine)
    if as_json:
        output.data([c.to_data() for c in checks])
    else:
        marks = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}
        for check in checks:
            ui.out.print(f"{marks[check.status]} {ui.safe(check.name)}: {ui.safe(check.detail)}")
            if check.remedy:
                ui.out.print(f"       [cyan]→[/] {ui.safe(check.remedy)}")
    if any(c.status == "fail" for c in checks):
        sys.exit(EXIT_DOCTOR)


@click.command()
@click.option(
    "--enforce",
    is_flag=True,
    help="Apply the admin's idle policy (root): warn, then stop runs idle too long.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the claimed GPUs as JSON.")
@click.pass_obj
def idle(app: Application, enforce: bool, as_json: bool) -> None:
    """For how long each claimed GPU has been idle (below the policy's threshold, 5% by
    default), from the samples gpuenv keeps in the state folder; each call adds one.
    With --enforce, run by root every minute (a systemd timer or cron), the policy in
    /etc/gpuenv/config.toml ([idle]) warns the owner of a run whose GPUs all stayed idle
    `warn_after`, and stops it `stop_after` later, recording why. Off without a policy."""
    report = check_idle(app.engine, enforcing=enforce)
    policy, source = report.policy, report.source
    for text in report.done:
        ui.info(text)
    rows, log = report.claims, report.log
    if as_json:
        described = source if policy is None else {**vars(policy), "source": source}
        output.data({"policy": described, "claims": rows, "log": log})
        return
    if policy is None:
        ui.info(source)
    else:
        ui.info(
            f"policy ({source}): below {policy.threshold}% for {duration(policy.warn_after)} "
            f"warns, {duration(policy.stop_after)} more stops"
        )
    for row in rows:
        seconds = row["idle_seconds"]
        state_text = "busy" if seconds is None else f"idle {duration(seconds)}"
        ui.out.print(
            ui.cell(f"{row['gpu']}  {row['user']} ({row['project']}, {row['holder']})")
            + f": {state_text}"
        )
    for entry in log[-5:]:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry["at"]))
        ui.out.print(f"{when} {ui.cell(entry['what'], limit=0)}")
