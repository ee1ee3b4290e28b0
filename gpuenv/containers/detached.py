"""Detached runs after `gpuenv run -d`: their output (`logs`, `attach`), their end
(`wait`) and their removal (`rm`), all through the engine seam. Only a run's owner (or
root) reads its output: a training log can carry what its environment holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuenv.common.labels import USAGE_LABEL
from gpuenv.containers.session import finished
from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import EngineRefused, UsageError
from gpuenv.monitoring.monitor import RunInfo, find_run

Write = Callable[[int, bytes], None]


def owned_run(runs: Sequence[RunInfo], name: str, uid: int, what: str) -> RunInfo:
    """The run named `name`, if `uid` may `what` it: its owner, or root."""
    run = find_run(runs, name)
    # A run whose owner its labels do not name is root's to handle, nobody else's.
    if uid != 0 and run.uid != uid:
        raise UsageError(f"{run.name} belongs to {run.user}: only its owner or root can {what} it")
    return run


def stream_logs(
    engine: ContainerEngine, run: RunInfo, *, follow: bool, tail: str, write: Write
) -> None:
    """The run's output so far, then (`follow`) as it comes, until it stops."""
    for kind, data in engine.logs(run.id, follow=follow, tail=tail):
        write(kind, data)


def attach_run(
    engine: ContainerEngine,
    run: RunInfo,
    *,
    write: Write,
    notice: Callable[[str], None],
) -> int | None:
    """Follow a running run's output from now on: its logs, followed from their end (an
    attach to a running container can lose what came with the engine's answer, which
    docker-py's attach socket does not hand over). Returns its exit code when it ends,
    None when the user detaches (Ctrl-C: the run goes on)."""
    if run.state != "running":
        raise UsageError(
            f"{run.name} is not running ({run.state})",
            hint=f"`gpuenv logs {run.name}` shows its output, `gpuenv wait {run.name}` its code",
        )
    try:
        for kind, data in engine.logs(run.id, follow=True, tail="0"):
            write(kind, data)
    except KeyboardInterrupt:
        notice(f"detached from {run.name}: it goes on running (`gpuenv attach {run.name}`)")
        return None
    return engine.wait(run.id)


def wait_run(engine: ContainerEngine, run: RunInfo) -> int:
    """Block until the run ends; its command's exit code."""
    try:
        return engine.wait(run.id)
    except EngineRefused as exc:
        if exc.status == 404:
            raise UsageError(f"{run.name} was removed before it could be waited for") from None
        raise


def remove_run(
    engine: ContainerEngine,
    run: RunInfo,
    ended: Callable[[str, int | None, float | None], None] | None = None,
) -> None:
    """Remove a run that has stopped (its output goes with it). `ended` first gets its
    usage label, exit code and end (Docker's ExitCode and FinishedAt) for its record."""
    if run.state == "running":
        raise UsageError(
            f"{run.name} is still running", hint=f"stop it first: `gpuenv stop {run.name}`"
        )
    if ended is not None:
        details = engine.inspect(run.id)
        label = ((details.get("Config") or {}).get("Labels") or {}).get(USAGE_LABEL)
        if label:
            ended(str(label), *finished(details))
    engine.remove(run.id)
