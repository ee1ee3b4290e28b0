"""Which GPUs a run gets: from the spec's `gpus` or `--gpus`, against the host's GPUs.

Grants name GPUs by UUID where the host's GPUs are known (stable across reboots and PCI
order), by index otherwise; the container is told exactly what was granted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuenv.errors import UsageError
from gpuenv.spec import GpuRequest, _Checker, parse_gpus_value

if TYPE_CHECKING:
    from gpuenv.host import Host


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
    from gpuenv.yamlfile import YamlDocument

    check = _Checker(YamlDocument("--gpus", None), ".")
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
