"""The runs on this host as `gpuenv ps`, `stop`, `logs`, `attach`, `wait` and `rm` see
them: each a function of the engine and the caller's uid, which the CLI parses for and
shows. Only a run's owner (or root) reads its output, attaches to it or removes it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.containers.detached import attach_run, owned_run, remove_run, stream_logs, wait_run
from gpuenv.engine.protocol import ContainerEngine
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

Write = Callable[[int, bytes], None]  # (1: stdout, 2: stderr), the bytes


@dataclass(frozen=True)
class Listed:
    """What `gpuenv ps` shows: the runs (with their GPUs' idle time), and the health
    findings of the GPUs each running one holds, as data, by run id."""

    runs: list[RunInfo]
    health: dict[str, list[dict[str, Any]]]


def list_on_host(engine: ContainerEngine, *, show_all: bool) -> Listed:
    """The gpuenv runs on this host; `show_all`: ended detached runs too."""
    runs = _with_idle(list_runs(engine, show_all=show_all))
    host = detect_host() if any(r.state == "running" for r in runs) else None
    health = {r.id: [f.to_data() for f in run_health(r, host)] if host else [] for r in runs}
    return Listed(runs, health)


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


def stop(engine: ContainerEngine, name: str, uid: int) -> tuple[RunInfo, bool]:
    """Stop the run called `name` (its owner, or root): the run, and whether it had
    already ended (nothing was stopped)."""
    run = stop_run(engine, list_runs(engine, show_all=True), name, uid)
    return run, run.state in ENDED_STATES


def logs(
    engine: ContainerEngine, name: str, uid: int, *, follow: bool, tail: str, write: Write
) -> None:
    """The run's output (its owner, or root), as it wrote it; with `follow`, until it ends."""
    run = owned_run(list_runs(engine, show_all=True), name, uid, "read the output of")
    stream_logs(engine, run, follow=follow, tail=tail, write=write)


def attach(
    engine: ContainerEngine,
    name: str,
    uid: int,
    *,
    write: Write,
    notice: Callable[[str], None],
) -> int | None:
    """Follow a running run's output from now on (its owner, or root): its exit code."""
    run = owned_run(list_runs(engine, show_all=True), name, uid, "attach to")
    return attach_run(engine, run, write=write, notice=notice)


def wait(engine: ContainerEngine, name: str) -> int:
    """Wait until the run ends: its command's exit code."""
    return wait_run(engine, find_run(list_runs(engine, show_all=True), name))


def remove(
    engine: ContainerEngine, names: Sequence[str], uid: int, warn: Callable[[str], None]
) -> list[tuple[str, RunInfo | GpuenvError]]:
    """Remove the ended detached runs `names` (their owner, or root), each end recorded
    in its owner's GPU-hours; for each name, the run removed or why it was not."""
    runs = list_runs(engine, show_all=True)

    def record_end(label: str, exit_code: int | None, end: float | None) -> None:
        try:  # never stops `rm`
            UsageLog(state_dir()).finish_for(label, exit_code, end)
        except (GpuenvError, OSError) as exc:
            warn(f"GPU usage of the run not recorded: {getattr(exc, 'message', exc)}")

    outcomes: list[tuple[str, RunInfo | GpuenvError]] = []
    for name in dict.fromkeys(names):
        try:
            run = owned_run(runs, name, uid, "remove")
            remove_run(engine, run, record_end)
        except GpuenvError as exc:
            outcomes.append((name, exc))
        else:
            outcomes.append((name, run))
    return outcomes
