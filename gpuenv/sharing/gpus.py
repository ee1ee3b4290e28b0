"""Which GPUs a run gets: from the spec's `gpus` or `--gpus`, against the host's GPUs.

Grants name GPUs by UUID where the host's GPUs are known (stable across reboots and PCI
order), by index otherwise; the container is told exactly what was granted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuenv.errors import GpusBusy, UsageError
from gpuenv.project.checker import Checker
from gpuenv.project.spec import GpuRequest
from gpuenv.project.validate import parse_gpus_value

if TYPE_CHECKING:
    from gpuenv.resolution.host import Gpu, Host
    from gpuenv.sharing.claims import Claim


@dataclass(frozen=True)
class Grant:
    """What a container gets: every GPU, none, or these devices."""

    mode: str  # "all" | "none" | "devices"
    devices: tuple[str, ...] = ()
    optional: bool = False  # run without GPUs (and say so) when the runtime is missing

    @property
    def visible_devices(self) -> str:
        """The value for NVIDIA_VISIBLE_DEVICES: never wider than the grant."""
        if self.mode == "all":
            return "all"
        if self.mode == "none":
            return "void"
        return ",".join(self.devices)

    def describe(self) -> str:
        if self.mode == "devices":
            return ",".join(self.devices)
        return self.mode


def parse_gpus_option(text: str) -> GpuRequest:
    """`--gpus all|none|optional|N|0,2|device=0|GPU-<uuid>,...`, with the spec's rules.

    A single number is a count, as in `docker run --gpus 2`; `device=0` names GPU 0.
    """
    stripped = text.strip()
    if stripped == "0":
        raise UsageError(
            "--gpus 0: a GPU count must be at least 1",
            hint="for the GPU with index 0 write --gpus device=0; for no GPU, --gpus none",
        )
    from gpuenv.common.yamlfile import YamlDocument

    check = Checker(YamlDocument("--gpus", None), ".")
    value: object = stripped.removeprefix("device=")
    if stripped.isdigit():
        value = int(stripped)
    elif stripped.startswith("device=") and stripped[7:].isdigit():
        value = [int(stripped[7:])]
    request = parse_gpus_value(check, value)
    if check.problems or request is None:
        message = check.problems[0].message if check.problems else "invalid value"
        raise UsageError(f"--gpus {text!r}: {message}")
    return request


def grant(request: GpuRequest, host: Host) -> Grant:
    """Turn a request into a grant for this host; errors name what the host has."""
    known = bool(host.gpus)
    if request.mode in ("all", "optional"):
        return Grant("all", optional=request.mode == "optional")
    if request.mode == "none":
        return Grant("none")
    if request.mode == "count":
        assert request.count is not None
        if known and request.count > len(host.gpus):
            raise UsageError(
                f"{request.count} GPUs requested, but this host has {len(host.gpus)}",
                hint="ask for fewer (--gpus N), or `--gpus all`",
            )
        chosen = host.gpus[: request.count]
        if known:
            return Grant("devices", tuple(g.uuid or str(g.index) for g in chosen))
        return Grant("devices", tuple(str(i) for i in range(request.count)))
    devices = []
    for device in request.devices:
        if device.isdigit() and known:
            match = next((g for g in host.gpus if g.index == int(device)), None)
            if match is None:
                indices = ", ".join(str(g.index) for g in host.gpus)
                raise UsageError(f"GPU {device} does not exist on this host (it has {indices})")
            devices.append(match.uuid or device)
        elif not device.isdigit() and known and not any(g.uuid == device for g in host.gpus):
            raise UsageError(f"no GPU with UUID {device} on this host")
        else:
            devices.append(device)
    return Grant("devices", tuple(devices))


def choose(request: GpuRequest, host: Host, claims: Sequence[Claim]) -> tuple[Grant, list[str]]:
    """The grant for a request on a shared host, and the GPU keys to claim for it.

    Free means: not claimed by a live gpuenv run, and without processes from outside
    gpuenv; among free GPUs the least loaded are taken. Named GPUs are taken if nobody
    holds them. Raises GpusBusy saying who holds what.
    """
    granted = grant(request, host)
    if not host.gpus or granted.mode == "none":
        return granted, []
    held = {claim.gpu: claim for claim in claims}
    by_key = {gpu.key: gpu for gpu in host.gpus}

    def holder(gpu: Gpu) -> str:
        if gpu.lost:
            return f"GPU {gpu.index}: fell off the bus ({gpu.lost})"
        if gpu.key in held:
            return f"GPU {gpu.index}: held by {held[gpu.key].describe()}"
        pids = ", ".join(str(p.pid) for p in gpu.processes)
        return f"GPU {gpu.index}: busy with processes outside gpuenv (pid {pids})"

    if request.mode == "count":
        assert request.count is not None
        free = [g for g in host.gpus if g.key not in held and not g.processes and not g.lost]
        if len(free) < request.count:
            taken = "; ".join(holder(g) for g in host.gpus if g not in free)
            raise GpusBusy(
                f"{request.count} GPU{'s' if request.count > 1 else ''} requested, "
                f"{len(free)} free on this host ({taken})",
                hint="wait for them with --wait, or ask for fewer",
            )
        free.sort(key=lambda g: (g.utilization or 0, g.memory_used_mib or 0, g.index))
        chosen = sorted(free[: request.count], key=lambda g: g.index)
        keys = [g.key for g in chosen]
        return Grant("devices", tuple(keys)), keys
    keys = list(granted.devices) if granted.mode == "devices" else list(by_key)
    busy = [by_key[k] for k in keys if k in by_key and (k in held or by_key[k].lost)]
    if busy:
        raise GpusBusy(
            "; ".join(holder(g) for g in busy),
            hint="wait with --wait, pick other GPUs (`gpuenv top` shows who uses what), "
            "or ask for a count (--gpus N) and gpuenv picks free ones",
        )
    return granted, keys
