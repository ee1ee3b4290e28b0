"""MIG instances: the host file's `mig` lists (docs/reference/host.md), and their CDI
device names.

nvidia-ctk names a MIG device ``MIG-<uuid>`` (``--device-name-strategy=uuid``) or
``<gpu index>:<MIG index>`` (``index``): nvidia-container-toolkit pkg/nvcdi/namer.go,
``GetMigDeviceName``. The legacy request takes the MIG UUID as a device id, as
NVIDIA_VISIBLE_DEVICES does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpuenv.errors import HostError
from gpuenv.resolution.machine import Gpu, MigDevice

# Patterns as text: re compiles (and keeps) each on its first use, not at import.
MIG_UUID = r"^MIG-[A-Za-z0-9-]+$"
_KEYS = {"uuid", "profile", "memory_total_mib", "index", "gpu_instance", "compute_instance"}


def migs_from_data(raw: Any, where: str) -> tuple[MigDevice, ...]:
    """A host file GPU's `mig`: a list of {uuid, profile, memory_total_mib, index,
    gpu_instance, compute_instance}; only `uuid` is required, the rest stays unknown."""
    from gpuenv.project.spec import is_mig_profile

    if not isinstance(raw, list):
        raise HostError(f'{where}: \'mig\' must be a list of MIG instances ({{"uuid": "MIG-…"}})')
    out: list[MigDevice] = []
    for position, item in enumerate(raw):
        at = f"{where}.mig[{position}]"
        if not isinstance(item, dict):
            raise HostError(f"{at}: expected an object with at least 'uuid'")
        unknown = set(item) - _KEYS
        if unknown:
            known = ", ".join(sorted(_KEYS))
            raise HostError(f"{at}: unknown keys {', '.join(sorted(unknown))} (known: {known})")
        uuid = item.get("uuid")
        if not isinstance(uuid, str) or not re.match(MIG_UUID, uuid):
            raise HostError(f"{at}: 'uuid' must be a MIG UUID (MIG-…), got {uuid!r}")
        if any(m.uuid == uuid for m in out):
            raise HostError(f"{at}: {uuid} is listed twice")
        profile = item.get("profile")
        if profile is not None and (not isinstance(profile, str) or not is_mig_profile(profile)):
            raise HostError(f"{at}: 'profile' {profile!r} is not a MIG profile like 1g.10gb")
        numbers: dict[str, int | None] = {}
        for key in ("memory_total_mib", "index", "gpu_instance", "compute_instance"):
            value = item.get(key)
            if value is not None and (type(value) is not int or value < 0):
                raise HostError(f"{at}: '{key}' must be a whole number ≥ 0")
            numbers[key] = value
        out.append(
            MigDevice(
                uuid,
                gpu_instance=numbers["gpu_instance"],
                compute_instance=numbers["compute_instance"],
                memory_total_mib=numbers["memory_total_mib"],
                index=numbers["index"],
                profile=profile,
                profile_source="host file" if profile else None,
            )
        )
    return tuple(out)


def cdi_mig_names(gpu: Gpu, devices: Mapping[str, str]) -> dict[str, str]:
    """The CDI device of each of the GPU's instances that `devices` (spec name -> qualified
    name) names, by MIG UUID or by ``<gpu index>:<MIG index>``.

    >>> gpu = Gpu(1, "A100", mig_devices=(MigDevice("MIG-a", index=0), MigDevice("MIG-b", index=1)))
    >>> cdi_mig_names(gpu, {"MIG-a": "nvidia.com/gpu=MIG-a", "1:1": "nvidia.com/gpu=1:1"})
    {'MIG-a': 'nvidia.com/gpu=MIG-a', 'MIG-b': 'nvidia.com/gpu=1:1'}
    """
    names = {}
    for mig in gpu.mig_devices:
        by_index = f"{gpu.index}:{mig.index}"
        if mig.uuid in devices:
            names[mig.uuid] = devices[mig.uuid]
        elif mig.index is not None and by_index in devices:
            names[mig.uuid] = devices[by_index]
    return names
