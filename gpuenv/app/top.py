"""`gpuenv top`'s data: every GPU of this host with its readings, health, claim, holder
and idle time, whatever else is unavailable (no engine, an unusable state folder)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuenv.engine.protocol import Engine
from gpuenv.errors import GpuenvError
from gpuenv.host.detect import detect_host
from gpuenv.host.machine import Host
from gpuenv.monitoring.fitness import unfit_gpus
from gpuenv.monitoring.history import recorded_findings
from gpuenv.monitoring.idle import idle_for, known_state
from gpuenv.monitoring.monitor import GpuRow, RunInfo, gpu_rows, list_runs
from gpuenv.reservations.claims import Claim, ClaimStore, Waiter


def top_snapshot(
    engine: Callable[[], Engine], notes: list[str] | None = None
) -> tuple[Host, list[GpuRow]]:
    """The host and one row per GPU. `engine` is asked for only when there are GPUs;
    why what it would add is missing (it does not answer) goes to `notes`."""
    host = detect_host()
    if not host.gpus:
        return host, []
    shared = read_shared(engine)
    try:
        unfit = unfit_gpus(host)
    except GpuenvError:  # the admin's config is invalid: `doctor` says so; the GPUs show
        unfit = {}
    rows = gpu_rows(host, shared.claims, read_runs(engine, notes), unfit)
    now = time.time()
    recorded = recorded_findings(host.gpus, now)
    for row, gpu in zip(rows, host.gpus, strict=True):
        row.idle_seconds = idle_for(shared.idle, gpu.key, now) if row.claimed_by else None
        row.health += [f.to_data() for f in recorded if f.gpu == gpu.index]
    return host, rows


@dataclass
class Shared:
    """The state folder's view: claims, waiters and idle samples (none where it is
    unusable: the GPUs show anyway)."""

    claims: list[Claim]
    waiters: list[Waiter]
    idle: dict[str, Any]


def read_shared(engine: Callable[[], Engine]) -> Shared:
    try:
        store = ClaimStore()
    except GpuenvError:
        return Shared([], [], {})
    try:
        return Shared(store.claims(), store.waiting(), known_state(store))
    except GpuenvError:
        return Shared([], [], {})
    finally:
        store.close()


def read_runs(engine: Callable[[], Engine], notes: list[str] | None = None) -> list[RunInfo]:
    """The gpuenv runs on the engine; none (and why, in `notes`) when it cannot be asked
    or does not answer: the GPUs and their claims still show."""
    try:
        return list_runs(engine())
    except GpuenvError as exc:
        if notes is not None:
            notes.append(f"runs not shown: {exc.message}")
        return []
