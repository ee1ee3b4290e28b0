"""MIG instances in the host file: each GPU's `mig` list (docs/reference/host.md)."""

from __future__ import annotations

import re
from typing import Any

from gpuenv.errors import HostError
from gpuenv.project.spec import is_mig_profile
from gpuenv.resolution.machine import MigDevice

MIG_UUID = re.compile(r"^MIG-[A-Za-z0-9-]+$")
_KEYS = {"uuid", "profile", "memory_total_mib", "index", "gpu_instance", "compute_instance"}


def migs_from_data(raw: Any, where: str) -> tuple[MigDevice, ...]:
    """A host file GPU's `mig`: a list of {uuid, profile, memory_total_mib, index,
    gpu_instance, compute_instance}; only `uuid` is required, the rest stays unknown."""
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
        if not isinstance(uuid, str) or not MIG_UUID.match(uuid):
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
