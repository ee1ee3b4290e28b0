"""Which GPUs a run gets: from the spec's `gpus` or `--gpus`, against the host's GPUs.

Grants name GPUs by UUID where the host's GPUs are known (stable across reboots and PCI
order), by index otherwise; the container is told exactly what was granted.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuenv.common.yamlfile import YamlDocument
from gpuenv.errors import GpuenvWarning, GpusBusy, UsageError
from gpuenv.host.machine import Gpu, GpuProcess, Host, MigDevice
from gpuenv.project.gpus import parse_gpus_value
from gpuenv.project.spec import GpuRequest
from gpuenv.project.validate import SpecChecker
from gpuenv.reservations.claims import Claim


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
    """`--gpus all|none|optional|N|0,2|device=0|GPU-<uuid>,MIG-<uuid>,...|mig=PROFILE[,count=N]`,
    with the spec's rules.

    A single number is a count, as in `docker run --gpus 2`; `device=0` names GPU 0.
    """
    stripped = text.strip()
    if stripped.startswith("mig="):
        return _mig_option(text)
    if stripped == "0":
        raise UsageError(
            "--gpus 0: a GPU count must be at least 1",
            hint="for the GPU with index 0 write --gpus device=0; for no GPU, --gpus none",
        )
    check = SpecChecker(YamlDocument("--gpus", None), ".")
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


def _mig_option(text: str) -> GpuRequest:
    """`mig=1g.10gb` or `mig=1g.10gb,count=2`: the spec's {mig, count} on the command line."""
    fields: dict[str, object] = {}
    for part in text.strip().split(","):
        key, _, value = part.strip().partition("=")
        if key in fields or key not in ("mig", "count") or not value:
            raise UsageError(
                f"--gpus {text!r}: expected mig=PROFILE or mig=PROFILE,count=N",
                hint="e.g. --gpus mig=1g.10gb,count=2 (`gpuenv doctor` lists this host's profiles)",
            )
        fields[key] = int(value) if key == "count" and value.isdigit() else value
    check = SpecChecker(YamlDocument("--gpus", None), ".")
    request = parse_gpus_value(check, fields)
    if check.problems or request is None:
        message = check.problems[0].message if check.problems else "invalid value"
        raise UsageError(f"--gpus {text!r}: {message}")
    return request


def mig_parents(host: Host) -> dict[str, Gpu]:
    """Each MIG instance's UUID -> the GPU it is a slice of."""
    return {mig.uuid: gpu for gpu in host.gpus for mig in gpu.mig_devices}


def _mig_grant(request: GpuRequest, host: Host) -> Grant:
    """`count` instances of the profile, the first ones by GPU and MIG index (no claims)."""
    return Grant("devices", tuple(m.uuid for m in _mig_candidates(request, host)[: request.count]))


def _mig_candidates(request: GpuRequest, host: Host) -> list[MigDevice]:
    """Every instance of the requested profile; a usage error when the host has too few."""
    if not host.gpus:
        raise UsageError(
            f"MIG instances requested ({request}), but this host's GPUs are not known",
            hint="MIG instances are found through NVML or described in the host file "
            "(docs/reference/host.md)",
        )
    instances = [m for gpu in host.gpus for m in gpu.mig_devices]
    matching = [m for m in instances if m.profile == request.profile]
    assert request.count is not None
    if len(matching) < request.count:
        profiles: dict[str, int] = {}
        for mig in instances:
            name = mig.profile or "unknown profile"
            profiles[name] = profiles.get(name, 0) + 1
        has = ", ".join(f"{n}× {p}" for p, n in profiles.items()) or "no MIG instance"
        raise UsageError(
            f"{request} requested, but this host has {len(matching)} "
            f"{request.profile} instance(s) ({has})",
            hint="ask for a profile it has, or fewer; `gpuenv doctor` lists the instances",
        )
    return matching


def grant(request: GpuRequest, host: Host) -> Grant:
    """Turn a request into a grant for this host; errors name what the host has."""
    if request.mode in ("all", "optional"):
        return Grant("all", optional=request.mode == "optional")
    if request.mode == "none":
        return Grant("none")
    if request.mode == "mig":
        return _mig_grant(request, host)
    if request.mode == "count":
        return _count_grant(request, host)
    return _devices_grant(request, host)


def _count_grant(request: GpuRequest, host: Host) -> Grant:
    """The first `count` GPUs; where the host's GPUs are unknown, indices 0..count-1."""
    assert request.count is not None
    if not host.gpus:
        return Grant("devices", tuple(str(i) for i in range(request.count)))
    if request.count > len(host.gpus):
        raise UsageError(
            f"{request.count} GPUs requested, but this host has {len(host.gpus)}",
            hint=f"ask for at most {len(host.gpus)} (--gpus, or `gpus:` in gpuenv.yaml), "
            "or `--gpus all`",
        )
    return Grant("devices", tuple(g.uuid or str(g.index) for g in host.gpus[: request.count]))


def _devices_grant(request: GpuRequest, host: Host) -> Grant:
    """The named GPUs and MIG instances, each one the host has; never a GPU together
    with one of its instances."""
    migs = mig_parents(host)
    devices = [_named_device(device, host, migs) for device in request.devices]
    both = [d for d in devices if d in migs and migs[d].key in devices]
    if both:
        raise UsageError(
            f"{both[0]} is a MIG instance of GPU {migs[both[0]].index}, also requested whole",
            hint="ask for the GPU or for its instances, not both",
        )
    return Grant("devices", tuple(devices))


def _named_device(device: str, host: Host, migs: Mapping[str, Gpu]) -> str:
    """A GPU index (as its UUID where known), GPU UUID or MIG UUID the host has; as
    named where the host's GPUs are unknown."""
    if not host.gpus:
        return device
    if device.isdigit():
        match = next((g for g in host.gpus if g.index == int(device)), None)
        if match is None:
            indices = ", ".join(str(g.index) for g in host.gpus)
            raise UsageError(f"GPU {device} does not exist on this host (it has {indices})")
        return match.uuid or device
    if device.startswith("MIG-"):
        if device not in migs:
            raise UsageError(
                f"no MIG instance with UUID {device} on this host",
                hint="`gpuenv doctor` lists this host's MIG instances",
            )
        return device
    if not any(g.uuid == device for g in host.gpus):
        raise UsageError(f"no GPU with UUID {device} on this host")
    return device


def choose(
    request: GpuRequest,
    host: Host,
    claims: Sequence[Claim],
    unfit: Mapping[str, str] | None = None,
) -> tuple[Grant, list[str]]:
    """The grant for a request on a shared host, and the GPU keys to claim for it.

    Free means: not claimed by a live gpuenv run, and without processes from outside
    gpuenv; among free GPUs the least loaded are taken. `unfit` GPUs (key -> why:
    unhealthy, drained by the admin; `gpuenv.monitoring.fitness`) are never given to a
    count request while the host has enough others, healthy ones busy included (the
    request then waits for them); a drained one never. Named GPUs are taken if nobody
    holds them, an unfit one with a warning. A GPU in MIG mode and its instances
    exclude each other: the GPU is not free while any instance is claimed, an instance
    not while its GPU is. Raises GpusBusy saying who holds what.
    """
    granted = grant(request, host)
    if not host.gpus or granted.mode == "none":
        return granted, []
    held = {claim.gpu: claim for claim in claims}
    unfit = unfit or {}
    if request.mode == "mig":
        keys = _free_instances(request, host, held, unfit)
        return Grant("devices", tuple(keys)), keys
    if request.mode == "count":
        keys = _least_loaded_free_gpus(request, host, held, unfit)
        return Grant("devices", tuple(keys)), keys
    keys = _unheld_keys(granted, host, held)
    by_key = {gpu.key: gpu for gpu in host.gpus}
    for key in keys:
        if key in unfit and key in by_key:
            warnings.warn(
                f"GPU {by_key[key].index} is {unfit[key]}; it was asked for by name, so it "
                "is used (`gpuenv top` shows its findings)",
                GpuenvWarning,
                stacklevel=2,
            )
    return granted, keys


def _free_instances(
    request: GpuRequest, host: Host, held: Mapping[str, Claim], unfit: Mapping[str, str]
) -> list[str]:
    """`count` free instances of the requested MIG profile, the first ones, none of an
    unfit GPU while enough instances of fit ones exist; GpusBusy naming who holds the
    others when too few are free."""
    candidates = _mig_candidates(request, host)
    assert request.count is not None
    parents = mig_parents(host)
    fit = [m for m in candidates if parents[m.uuid].key not in unfit]
    # Too few instances on fit GPUs: the unfit GPUs' come last, and are said.
    rest = [] if len(fit) >= request.count else [m for m in candidates if m not in fit]
    candidates = fit + rest
    open_migs = [m for m in candidates if _instance_not_free(m, held, parents) is None]
    given = [parents[m.uuid] for m in open_migs[: request.count] if m not in fit]
    for gpu in dict.fromkeys(given):
        warnings.warn(
            f"too few MIG instances on healthy GPUs: instances of GPU {gpu.index} are given, "
            f"which is {unfit[gpu.key]}",
            GpuenvWarning,
            stacklevel=3,
        )
    if len(open_migs) < request.count:
        taken = "; ".join(h for m in candidates if (h := _instance_not_free(m, held, parents)))
        raise GpusBusy(
            f"{request} requested, {len(open_migs)} free on this host ({taken})",
            hint=f"wait for them with --wait, or ask for at most {len(open_migs)}",
        )
    return [m.uuid for m in open_migs[: request.count]]


def _least_loaded_free_gpus(
    request: GpuRequest, host: Host, held: Mapping[str, Claim], unfit: Mapping[str, str]
) -> list[str]:
    """`count` free whole GPUs, the least loaded, in index order; GpusBusy naming who
    holds the others (and which are unfit) when too few are free."""
    assert request.count is not None
    usable = _usable(request.count, host, unfit)
    free = [
        g
        for g in host.gpus
        if g.key in usable and not _gpu_taken(g, held) and not _outside_processes(g)
    ]
    if len(free) < request.count:
        taken = "; ".join(
            f"GPU {g.index}: {unfit[g.key]}" if g.key not in usable else _holder(g, held)
            for g in host.gpus
            if g not in free
        )
        raise GpusBusy(
            f"{request.count} GPU{'s' if request.count > 1 else ''} requested, "
            f"{len(free)} free on this host ({taken})",
            hint=(
                f"wait for them with --wait, or ask for at most {len(free)}"
                if len(usable) >= request.count
                else f"this host has {len(usable)} usable GPUs (the others are drained or "
                f"unfit): ask for at most {len(usable)} (--gpus, or `gpus:` in gpuenv.yaml)"
            ),
        )
    # Whole GPUs out of MIG mode first: a MIG GPU given whole is its slices' loss.
    free.sort(key=lambda g: (bool(g.mig_mode), g.utilization or 0, g.memory_used_mib or 0, g.index))
    chosen = sorted(free[: request.count], key=lambda g: g.index)
    return [g.key for g in chosen]


def _usable(count: int, host: Host, unfit: Mapping[str, str]) -> set[str]:
    """The GPUs a count request may get: the fit ones, where the host has `count` of them
    (busy or not: the request waits for them rather than take a failing one); else the
    unhealthy ones too, with a warning. Never a drained or lost one."""
    fit = {g.key for g in host.gpus if g.key not in unfit}
    if len(fit) >= count:
        return fit
    failing = {
        g.key for g in host.gpus if unfit.get(g.key, "").startswith("unhealthy") and not g.lost
    }
    if failing:
        warnings.warn(
            f"this host has {len(fit)} healthy GPU{'s' if len(fit) != 1 else ''} for "
            f"{count} requested: unhealthy ones may be given ("
            + "; ".join(f"GPU {g.index}: {unfit[g.key]}" for g in host.gpus if g.key in failing)
            + ")",
            GpuenvWarning,
            stacklevel=3,
        )
    return fit | failing


def _unheld_keys(granted: Grant, host: Host, held: Mapping[str, Claim]) -> list[str]:
    """The keys of the granted GPUs and instances (every GPU for `all`); GpusBusy when
    any of them is held."""
    by_key = {gpu.key: gpu for gpu in host.gpus}
    parents = mig_parents(host)
    keys = list(granted.devices) if granted.mode == "devices" else list(by_key)
    busy = [_holder(by_key[k], held) for k in keys if k in by_key and _gpu_taken(by_key[k], held)]
    busy += [h for k in keys if k in parents and (h := _mig_holder(k, held, parents))]
    if busy:
        raise GpusBusy(
            "; ".join(busy),
            hint="wait with --wait, pick other GPUs (`gpuenv top` shows who uses what), "
            "or ask for a count (--gpus N) and gpuenv picks free ones",
        )
    return keys


def _instance_holders(gpu: Gpu, held: Mapping[str, Claim]) -> list[str]:
    """Who holds each claimed MIG instance of `gpu`."""
    return [
        f"MIG {m.uuid[:12]}: held by {held[m.uuid].describe()}"
        for m in gpu.mig_devices
        if m.uuid in held
    ]


def _gpu_taken(gpu: Gpu, held: Mapping[str, Claim]) -> bool:
    return gpu.key in held or bool(gpu.lost) or bool(_instance_holders(gpu, held))


def _holder(gpu: Gpu, held: Mapping[str, Claim]) -> str:
    """Why `gpu` is not free, for a message."""
    if gpu.lost:
        return f"GPU {gpu.index}: fell off the bus ({gpu.lost})"
    if gpu.key in held:
        return f"GPU {gpu.index}: held by {held[gpu.key].describe()}"
    if _instance_holders(gpu, held):
        return f"GPU {gpu.index} (MIG): " + ", ".join(_instance_holders(gpu, held))
    pids = ", ".join(str(p.pid) for p in _outside_processes(gpu))
    return f"GPU {gpu.index}: busy with processes outside gpuenv (pid {pids})"


def _mig_holder(uuid: str, held: Mapping[str, Claim], parents: Mapping[str, Gpu]) -> str | None:
    """Who holds a MIG instance, or its GPU (whole); None when neither is held."""
    parent = parents[uuid]
    if uuid in held:
        return f"MIG {uuid}: held by {held[uuid].describe()}"
    if parent.key in held or parent.lost:
        return f"MIG {uuid} of {_holder(parent, held)}"
    return None


def _instance_not_free(
    mig: MigDevice, held: Mapping[str, Claim], parents: Mapping[str, Gpu]
) -> str | None:
    """Held, its GPU held, or used by processes (NVML lists them per instance)."""
    if not mig.processes:
        return _mig_holder(mig.uuid, held, parents)
    pids = ", ".join(str(p.pid) for p in mig.processes)
    return (
        _mig_holder(mig.uuid, held, parents) or f"MIG {mig.uuid}: busy with processes (pid {pids})"
    )


def _outside_processes(gpu: Gpu) -> list[GpuProcess]:
    """The processes NVML shows on a GPU, or on any of its MIG instances: a MIG GPU
    lists its processes per instance (its own list needs a privileged user), so one
    whose instances are in use is not free whole."""
    return [*gpu.processes, *(p for mig in gpu.mig_devices for p in mig.processes)]
