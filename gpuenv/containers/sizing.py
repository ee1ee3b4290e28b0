"""Is this GPU server sized as GPU server guides advise? For `doctor` and the dashboard:
system memory against the GPUs' memory, the storage under the engine's data root, and
room there for the images a project's lock needs. Thresholds are the admin's settings
(`[sizing]` in /etc/gpuenv/config.toml), not constants."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuenv.common.siteconfig import read_site_config
from gpuenv.errors import UsageError
from gpuenv.host.machine import Gpu

# status, detail, remedy (remedy empty when ok)
Finding = tuple[str, str, str]
KEYS = ("memory_ratio", "image_gb", "free_warn_gb", "free_fail_gb")


@dataclass(frozen=True)
class SizingSettings:
    memory_ratio: float = 2.0  # system memory ≥ this × all GPUs' memory (advice: 2-3×)
    image_gb: float = 20.0  # room per locked image not pulled yet (NGC images: 10-20 GB)
    free_warn_gb: float = 40.0  # less free space in the data root warns
    free_fail_gb: float = 10.0  # and less than this fails

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> SizingSettings:
        site = read_site_config(env)
        section = (site.data or {}).get("sizing") or {}
        if not isinstance(section, dict) or set(section) - set(KEYS):
            raise UsageError(f"{site.path}: [sizing] takes {', '.join(KEYS)} only")
        values = {}
        for key in KEYS:
            value = section.get(key, getattr(cls, key))
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise UsageError(f"{site.path}: [sizing] {key} = {value!r} is not a number ≥ 0")
            values[key] = float(value)
        return cls(**values)


def system_memory_mib() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        return None


def memory_finding(
    system_mib: int | None, gpus: Sequence[Gpu], settings: SizingSettings
) -> Finding | None:
    """System memory against the GPUs' memory; None when either is unknown.

    >>> memory_finding(262144, [Gpu(0, "A100", memory_total_mib=81920)] * 2, SizingSettings())[0]
    'warn'
    """
    gpu_mib = sum(g.memory_total_mib or 0 for g in gpus)
    if system_mib is None or not gpu_mib:
        return None
    ratio = system_mib / gpu_mib
    detail = (
        f"{system_mib / 1024:.0f} GiB of system memory for {gpu_mib / 1024:.0f} GiB of GPU "
        f"memory ({ratio:.1f}×)"
    )
    if ratio >= settings.memory_ratio:
        return "ok", detail, ""
    want = settings.memory_ratio * gpu_mib / 1024
    return (
        "warn",
        detail,
        f"GPU servers are usually given 2-3× their GPU memory, and this host's setting "
        f"asks for {settings.memory_ratio:g}× (≥ {want:.0f} GiB here): data loaders, pinned "
        "buffers and checkpoints live there; "
        "add memory, or set [sizing] memory_ratio in /etc/gpuenv/config.toml",
    )


def storage_kind(path: str, sys_root: str = "/sys") -> tuple[str, str] | None:
    """(kind, device) of the block device `path` is on: kind nvme, ssd or rotating; None
    when it is not on a local block device (overlay, tmpfs, a network file system)."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return None
    major, minor = os.major(device), os.minor(device)
    if major == 0:
        return None
    node = os.path.realpath(os.path.join(sys_root, "dev", "block", f"{major}:{minor}"))
    if os.path.exists(os.path.join(node, "partition")):
        node = os.path.dirname(node)
    name = os.path.basename(node)
    try:
        with open(os.path.join(node, "queue", "rotational"), encoding="ascii") as handle:
            rotational = handle.read(8).strip() == "1"
    except OSError:
        return None
    if rotational:
        return "rotating", name
    return ("nvme" if name.startswith("nvme") else "ssd"), name


def storage_finding(root: str, kind: tuple[str, str] | None) -> Finding:
    if kind is None:
        return "ok", f"{root}: not on a local block device gpuenv can identify", ""
    what, device = kind
    if what == "rotating":
        return (
            "warn",
            f"{root} is on rotating storage ({device})",
            "NGC images are 10-20 GB: pulls, builds and container starts wait on the disk; "
            "move the engine's data root to an SSD or NVMe drive (Docker: `data-root` in "
            "/etc/docker/daemon.json)",
        )
    label = "NVMe" if what == "nvme" else "SSD"
    return "ok", f"{root} is on {label} storage ({device})", ""


def disk_finding(root: str, missing_images: int, settings: SizingSettings) -> Finding:
    """Free space in the data root, against the thresholds and the locked images that
    are not there yet."""
    try:
        free = shutil.disk_usage(root).free / 1e9
    except OSError:
        return "warn", f"cannot read free space of {root} (another host?)", ""
    needed = missing_images * settings.image_gb
    detail = f"{free:.0f} GB free in {root}"
    if needed:
        detail += f"; the lock's image is not here yet (about {needed:.0f} GB)"
    if free < max(settings.free_fail_gb, needed):
        return (
            "fail",
            detail,
            "free space: NGC images need 10-20 GB each (`gpuenv gc --yes`, `docker system prune`)",
        )
    if free < settings.free_warn_gb + needed:
        return (
            "warn",
            detail,
            "NGC images need 10-20 GB each; `gpuenv gc` lists unused gpuenv images",
        )
    return "ok", detail, ""
