"""Who uses which GPU: gpuenv's run containers, their claims, and NVML's processes mapped
to containers through /proc/<pid>/cgroup (so no --pid=host is needed)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuenv.common.labels import DETACHED_LABEL, RUN_LABEL
from gpuenv.engine.protocol import ContainerEngine
from gpuenv.errors import UsageError
from gpuenv.host.machine import GpuProcess, Host, MigDevice
from gpuenv.host.procfs import container_of, process_owner
from gpuenv.monitoring.health import Finding, assess
from gpuenv.project.ports import Port, listed
from gpuenv.reservations.claims import Claim
from gpuenv.reservations.holders import user_uid as user_uid


@dataclass(frozen=True)
class RunInfo:
    id: str
    name: str
    project: str
    user: str
    uid: int | None
    gpus: str
    command: str
    image: str
    started: str
    state: str
    pid: int | None
    detached: bool = False
    idle_seconds: float | None = None  # its GPUs below the idle threshold (gpuenv idle)
    idle_warned: bool = False  # the idle policy warned it: it is stopped unless it works
    ports: tuple[Port, ...] = ()  # what it publishes on the host (-p, the spec's ports)

    @property
    def uptime(self) -> str:
        try:
            started = time.mktime(time.strptime(self.started, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
        except ValueError:
            return "?"
        seconds = max(0, int(time.time() - started))
        hours, rest = divmod(seconds, 3600)
        return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"

    def to_data(self) -> dict[str, Any]:
        data = {**asdict(self), "uptime": self.uptime}
        data["ports"] = [
            {**asdict(port), "url": port.url() if port.protocol == "tcp" else None}
            for port in self.ports
        ]
        return data


def list_runs(engine: ContainerEngine, *, show_all: bool = False) -> list[RunInfo]:
    """gpuenv's runs on this engine: running ones, and stopped ones with `show_all`."""
    runs = runs_from(engine.containers(RUN_LABEL))
    return runs if show_all else [r for r in runs if r.state == "running"]


def find_run(runs: Sequence[RunInfo], name: str) -> RunInfo:
    """The run named `name`, or whose id starts with it; a usage error otherwise."""
    matches = [r for r in runs if r.name == name or r.id.startswith(name)]
    if not matches:
        raise UsageError(f"no gpuenv run named {name!r}", hint="`gpuenv ps` lists them")
    if len(matches) > 1:
        raise UsageError(f"{name!r} matches {len(matches)} runs; give more of the id")
    return matches[0]


def stop_run(engine: ContainerEngine, runs: Sequence[RunInfo], name: str, uid: int) -> RunInfo:
    """Stop a run (SIGTERM, SIGKILL after 10 s): its owner's, or anyone's for root."""
    run = find_run(runs, name)
    # A run whose owner its labels do not name is root's to handle, nobody else's.
    if uid != 0 and run.uid != uid:
        raise UsageError(f"{run.name} belongs to {run.user}: only its owner or root can stop it")
    if run.state in ENDED_STATES:
        return run  # nothing to stop: the caller says so
    engine.stop(run.id, 10)
    return run


ENDED_STATES = frozenset({"exited", "dead", "stopped"})  # Podman says stopped too


def runs_from(containers: Sequence[dict[str, Any]]) -> list[RunInfo]:
    out = []
    for container in containers:
        labels = container.get("Labels") or {}
        if RUN_LABEL not in labels:
            continue
        user = labels.get("io.gpuenv.user", "?")
        pid = labels.get("io.gpuenv.pid", "")
        out.append(
            RunInfo(
                id=container["Id"],
                name=str((container.get("Names") or ["?"])[0]).lstrip("/"),
                project=labels.get("io.gpuenv.project", "?"),
                user=user,
                uid=user_uid(labels),
                gpus=labels.get("io.gpuenv.gpus", "?"),
                command=labels.get("io.gpuenv.command", ""),
                image=str(container.get("Image", "")),
                started=labels.get("io.gpuenv.started") or _created(container),
                state=str(container.get("State", "")),
                pid=int(pid) if pid.isdigit() else None,
                detached=labels.get(DETACHED_LABEL) == "1",
                ports=tuple(listed(container.get("Ports"))),
            )
        )
    return sorted(out, key=lambda r: r.started)


def _created(container: Mapping[str, Any]) -> str:
    """When the engine made the container, as the started label says it (an editor's
    container has no such label: its labels are written before it exists).

    >>> _created({"Created": 0}), _created({})
    ('1970-01-01T00:00:00Z', '')
    """
    created = container.get("Created")
    if not isinstance(created, int) or isinstance(created, bool):
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))


@dataclass
class GpuRow:
    index: int
    name: str
    uuid: str | None
    utilization: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    claimed_by: dict[str, Any] | None = None
    users: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] = field(default_factory=list)  # gpuenv.monitoring.health
    unfit: str | None = None  # why a count request does not get it (gpuenv.monitoring.fitness)
    idle_seconds: float | None = None  # below the idle threshold this long (gpuenv idle)
    # The GPU's MIG instances, each with who holds it; utilization None where NVML cannot
    # read it per instance (the usual case): unknown, never 0 %.
    mig: list[dict[str, Any]] = field(default_factory=list)

    def to_data(self) -> dict[str, Any]:
        return asdict(self)


def gpu_rows(
    host: Host,
    claims: Sequence[Claim],
    runs: Sequence[RunInfo],
    unfit: Mapping[str, str] | None = None,
) -> list[GpuRow]:
    """One row per GPU: its state, the claim on it, what runs on it, and why it is not
    to be handed out (`unfit`: unhealthy, drained)."""
    held = {claim.gpu: claim for claim in claims}
    by_container = {run.id: run for run in runs}
    rows = []
    for gpu in host.gpus:
        claim = held.get(gpu.key)
        row = GpuRow(
            gpu.index,
            gpu.name,
            gpu.uuid,
            gpu.utilization,
            gpu.memory_used_mib,
            gpu.memory_total_mib,
            gpu.temperature_c,
            gpu.power_w,
            gpu.power_limit_w,
            claimed_by=(
                {"user": claim.user, "project": claim.project, "pid": claim.pid} if claim else None
            ),
            health=[finding.to_data() for finding in assess(gpu)],
            unfit=(unfit or {}).get(gpu.key),
            mig=[_mig_row(mig, held.get(mig.uuid), by_container) for mig in gpu.mig_devices],
        )
        row.users = [process_user(process, by_container) for process in gpu.processes]
        rows.append(row)
    return rows


def process_user(process: GpuProcess, by_container: Mapping[str, RunInfo]) -> dict[str, Any]:
    """Who a GPU process is: a gpuenv run (by its container's cgroup), or outside gpuenv."""
    container = container_of(process.pid)
    run = by_container.get(container or "")
    if run is not None:
        return {
            "pid": process.pid,
            "memory_mib": process.used_memory_mib,
            "gpuenv": True,
            "run": run.name,
            "project": run.project,
            "user": run.user,
            "container": run.id[:12],
        }
    return {
        "pid": process.pid,
        "memory_mib": process.used_memory_mib,
        "gpuenv": False,
        "container": (container or "")[:12] or None,
        "user": process_owner(process.pid),
    }


def _mig_row(
    mig: MigDevice, claim: Claim | None, by_container: Mapping[str, RunInfo]
) -> dict[str, Any]:
    return {
        "uuid": mig.uuid,
        "index": mig.index,
        "profile": mig.profile,
        "profile_source": mig.profile_source,
        "memory_total_mib": mig.memory_total_mib,
        "utilization": mig.utilization,
        "claimed_by": (
            {"user": claim.user, "project": claim.project, "pid": claim.pid} if claim else None
        ),
        "users": [process_user(process, by_container) for process in mig.processes],
    }


def run_health(run: RunInfo, host: Host) -> list[Finding]:
    """The health findings on the GPUs a run holds (by UUID or index, a MIG instance's
    GPU for the instance; "all": every GPU)."""
    held = {key.strip() for key in run.gpus.split(",")}
    gpus = [
        gpu
        for gpu in host.gpus
        if "all" in held
        or gpu.key in held
        or str(gpu.index) in held
        or gpu.uuid in held
        or any(m.uuid in held for m in gpu.mig_devices)
    ]
    return [finding for gpu in gpus for finding in assess(gpu)]
