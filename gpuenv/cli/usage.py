"""gpuenv usage: GPU-hours of the runs on this host, per user, project or GPU model."""

from __future__ import annotations

import click
from rich.table import Table

from gpuenv.app.usage import usage_report
from gpuenv.cli import output, ui


@click.command()
@click.option(
    "--since",
    metavar="WHEN",
    help="Only usage after WHEN: a duration back from now (30m, 12h, 7d, 2w) or a date "
    "(2026-11-01, UTC). Default: every record.",
)
@click.option(
    "--by",
    type=click.Choice(["user", "project", "gpu"]),
    default="user",
    show_default=True,
    help="Sum per user, per project, or per GPU model.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the sums as JSON.")
def usage(since: str | None, by: str, as_json: bool) -> None:
    """Add up the GPU-hours of gpuenv runs on this host (attached, stopped, or killed
    and cleaned up later; running ones count until now). Root sees every user; a user
    their own runs. With prices per GPU model in the host config (GPUENV_HOST_CONFIG,
    default /etc/gpuenv/host.yaml), a cost column too."""
    usage = usage_report(since, by)
    rows, running, unrecorded = usage.rows, usage.running, usage.unrecorded
    if as_json:
        output.data(
            {
                "by": usage.by,
                "since": usage.since or None,
                "currency": usage.currency,
                "rows": [row.to_data() for row in rows],
                "running": running,
                "unrecorded": unrecorded,
            }
        )
        return
    if not rows:
        ui.info("no GPU usage recorded on this host" + (f" since {since}" if since else ""))
    else:
        table = Table(title_justify="left")
        for column in (by, "runs", "GPU-hours", *(["cost"] if usage.priced else [])):
            table.add_column(column, justify="left" if column == by else "right")
        for row in rows:
            cost = (
                []
                if not usage.priced
                else ["-" if row.cost is None else f"{row.cost:.2f} {usage.currency}".strip()]
            )
            table.add_row(ui.cell(row.key), str(row.runs), f"{row.gpu_hours:.2f}", *cost)
        ui.table(table)
    if running:
        ui.info(f"{running} run{'s' if running > 1 else ''} still running: counted until now")
    if unrecorded:
        ui.warn(
            f"{unrecorded} run{'s' if unrecorded > 1 else ''} ended without an end record "
            "(its gpuenv was killed and its container not yet removed): not counted; the "
            "next `gpuenv run` on this host records them"
        )
