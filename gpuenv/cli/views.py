"""Tables and summaries the commands print (rich), kept apart from the commands."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table

from gpuenv.cli import ui
from gpuenv.cli.ui import cell, safe
from gpuenv.common.units import duration
from gpuenv.host.machine import Host
from gpuenv.resolution.verdicts import Resolution


def show_resolution(resolution: Resolution) -> None:
    row = resolution.row
    parts = [
        f"{row.label.split()[0]} {row.framework_version or '(version not recorded)'}"
        if row.framework != "none"
        else None,
        f"CUDA {row.cuda}" if row.cuda else None,
        f"cuDNN {row.cudnn}" if row.cudnn else None,
        f"Python {row.python}" if row.python else None,
        f"Ubuntu {row.ubuntu}" if row.ubuntu else None,
    ]
    ui.detail(" · ".join(p for p in parts if p))
    requires = f"needs driver ≥ {resolution.candidate.min_driver or 'unknown'}"
    if row.min_compute_capability:
        requires += f", compute capability ≥ {row.min_compute_capability}"
    ui.detail(f"{requires}; host: {resolution.candidate.driver_route}")
    ui.detail(f"evidence: {row.evidence_text}")
    for warning in resolution.warnings:
        ui.warn(warning)


def explain_table(candidates: Any, chosen: Any | None, host: Host) -> None:
    table = Table(
        title=f"Candidates for {cell(host.describe())}", title_justify="left", expand=False
    )
    for column in ("", "image", "version", "CUDA", "Python", "driver ≥", "why"):
        table.add_column(column, overflow="fold")
    for candidate in candidates:
        row = candidate.row
        if candidate is chosen:
            mark, why = "[green]✓[/]", "[green]chosen: newest that fits[/]"
        elif candidate.ok:
            mark, why = "[green]✓[/]", "fits (older)"
        else:
            mark = "[red]✗[/]"
            why = safe("; ".join(r.reason for r in candidate.rejections))
        table.add_row(
            mark,
            cell(row.tag),
            cell(row.framework_version or "?"),
            cell(row.cuda or "?"),
            cell(row.python or "?"),
            cell(str(candidate.min_driver or "?")),
            why,
        )
    ui.table(table)


def age(created: int) -> str:
    seconds = max(0, int(time.time()) - created)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def images_table(rows: Any) -> Table:
    table = Table(title_justify="left")
    for column in ("image", "project", "size", "age", "status"):
        table.add_column(column)
    for row in rows:
        status = "[green]in use[/]" if row.referenced else f"[yellow]{cell(row.reason)}[/]"
        table.add_row(
            cell(", ".join(row.info.tags) or row.info.id[:19]),
            cell(row.project),
            f"{row.info.size / 1e9:.2f} GB",
            age(row.info.created),
            status,
        )
    return table


def runs_table(runs: Any) -> Table:
    table = Table(title_justify="left")
    for column in ("run", "project", "user", "GPUs", "command", "image", "up", "state", "ports"):
        table.add_column(column, overflow="fold")
    for run in runs:
        # UUIDs are long: their first block is enough to tell GPUs apart on a table.
        gpus = ",".join(
            g[:12] if g.startswith(("GPU-", "MIG-")) else g for g in run.gpus.split(",")
        )
        state = cell(f"{run.state}, detached" if run.detached else run.state)
        if run.idle_seconds is not None:
            state += f", idle {duration(run.idle_seconds)}"
        if run.idle_warned:
            state += " [yellow](warned: it will be stopped)[/]"
        table.add_row(
            cell(run.name),
            cell(run.project),
            cell(run.user),
            cell(gpus),
            cell(run.command),
            cell(run.image),
            cell(run.uptime),
            state,
            cell(" ".join(f"{p.address}:{p.host}→{p.container}" for p in run.ports) or "-"),
        )
    return table


def top_table(host: Any, rows: list[Any]) -> Any:
    table = Table(title=cell(host.describe()), title_justify="left")
    for column in ("GPU", "name", "util", "memory", "temp", "power", "health", "held by / used by"):
        table.add_column(column, overflow="fold")

    def number(value: Any, unit: str) -> str:
        return "-" if value is None else f"{value:.0f}{unit}"

    for row in rows:
        users = []
        if row.claimed_by:
            idle = ""
            if row.idle_seconds is not None:
                idle = f", [yellow]idle {duration(row.idle_seconds)}[/]"
            holder = row.claimed_by
            users.append(f"claimed: {cell(holder['user'])} ({cell(holder['project'])}){idle}")
        users += [_user_line(user) for user in row.users]
        held = sum(1 for mig in row.mig if mig["claimed_by"])
        if held:
            users.append(f"MIG: {held} of {len(row.mig)} instances claimed (below)")
        memory = (
            f"{number(row.memory_used_mib, '')}/{number(row.memory_total_mib, ' MiB')}"
            if row.memory_total_mib
            else number(row.memory_used_mib, " MiB")
        )
        power = f"{number(row.power_w, '')}/{number(row.power_limit_w, ' W')}"
        table.add_row(
            str(row.index),
            cell(row.name),
            number(row.utilization, "%"),
            memory,
            number(row.temperature_c, "°C"),
            power,
            health_cell(row.health),
            "\n".join(users) or _unused(row),
        )
        for mig in row.mig:
            holder = mig["claimed_by"]
            table.add_row(
                f"  {row.index}:{'?' if mig['index'] is None else mig['index']}",
                f"MIG {cell(mig['profile'] or 'profile unknown')} {cell(mig['uuid'][:12])}",
                "n/a" if mig["utilization"] is None else f"{mig['utilization']}%",
                number(mig["memory_total_mib"], " MiB"),
                "",
                "",
                "",
                "\n".join(
                    ([_claimed(holder)] if holder else [])
                    + [_user_line(user) for user in mig["users"]]
                )
                or "[green]free[/]",
            )
    return table


def _claimed(holder: dict[str, Any]) -> str:
    return f"claimed: {cell(holder['user'])} ({cell(holder['project'])})"


def _user_line(user: dict[str, Any]) -> str:
    if user["gpuenv"]:
        run, project, who = cell(user["run"]), cell(user["project"]), cell(user["user"])
        return f"{run} ({project}, {who}) pid {user['pid']}"
    where = f"container {cell(user['container'])}" if user["container"] else "no container"
    return f"[yellow]outside gpuenv[/]: pid {user['pid']} ({cell(user['user'])}, {where})"


def mig_note(rows: list[Any]) -> list[str]:
    """Why a MIG instance's utilization reads n/a (said once, below the table)."""
    if any(m["utilization"] is None for row in rows for m in row.mig):
        return [
            "MIG instances: utilization n/a: NVML does not report utilization on GPUs in "
            "MIG mode, per instance or whole, on this host"
        ]
    return []


def _unused(row: Any) -> str:
    """An unclaimed GPU: free, or why a count request does not get it."""
    if any(f["kind"] == "lost" for f in row.health):
        return "[red]unusable[/]"
    if row.unfit:
        return f"[red]{cell(row.unfit)}[/]"
    return "[green]free[/]"


HEALTH_STYLES = {"info": "cyan", "warn": "yellow", "fail": "red"}


def health_cell(findings: list[dict[str, Any]]) -> str:
    """The findings' short names, coloured by severity; "ok" without any."""
    if not findings:
        return "[green]ok[/]"
    return "\n".join(
        f"[{HEALTH_STYLES[f['severity']]}]{cell(f['kind'].replace('_', ' '))}[/]" for f in findings
    )


def health_lines(findings: list[dict[str, Any]]) -> list[str]:
    """One line per finding, with its remedy, for below a table."""
    return [
        f"[{HEALTH_STYLES[f['severity']]}]{safe(f['message'])}[/]: {safe(f['remedy'])}"
        for f in findings
    ]


def top_view(host: Any, rows: list[Any]) -> Group:
    """The GPU table, then each health finding with its remedy."""
    lines = health_lines([finding for row in rows for finding in row.health])
    return Group(top_table(host, rows), *mig_note(rows), *lines)
