"""A host described in a JSON file (GPUENV_HOST_FILE; docs/reference/host.md): to plan
for another machine, and to test. Validated like every file a person writes: all its
problems at once, each with its line and column."""

from __future__ import annotations

import re
from typing import Any

from gpuenv.common.checker import Checker
from gpuenv.common.files import NotAFile, read_capped
from gpuenv.common.platforms import PLATFORMS
from gpuenv.common.yamlfile import Path, YamlSyntaxError, parse_json
from gpuenv.errors import HostFileError, file_error
from gpuenv.host.machine import Gpu, GpuProcess, Host, MigDevice
from gpuenv.project.spec import is_mig_profile

HOST_FILE_ENV = "GPUENV_HOST_FILE"
MIG_UUID = r"^MIG-[A-Za-z0-9-]+$"
HOST_KEYS = ("driver", "cuda_driver", "gpus", "note", "platform")
# Live readings a host file may describe too: the same findings as NVML's follow.
READINGS = ("utilization", "memory_used_mib", "temperature_c", "power_w", "power_limit_w")
HEALTH_NUMBERS = (
    "clocks_event_reasons",
    "slowdown_temperature_c",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "memory_clock_mhz",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
    "ecc_corrected",
    "ecc_uncorrected",
)
GPU_KEYS = (
    "index",
    "name",
    "uuid",
    "compute_capability",
    "memory_total_mib",
    "brand",
    *READINGS,
    "processes",
    *HEALTH_NUMBERS,
    "pci_bus_id",
    "lost",
    "xids",
    "mig",
)
MIG_KEYS = ("uuid", "profile", "memory_total_mib", "index", "gpu_instance")
# What a GPU can physically report (the widest of any GPU NVML knows, with room): a
# reading outside it is a typo or a broken exporter, refused with its field.
RANGES: dict[str, tuple[float, float, str]] = {
    "utilization": (0, 100, " (%)"),
    "memory_used_mib": (0, 2**24, " MiB"),
    "temperature_c": (-40, 150, " °C"),
    "power_w": (0, 10_000, " W"),
    "power_limit_w": (0, 10_000, " W"),
    "clocks_event_reasons": (0, 2**64 - 1, ""),
    "slowdown_temperature_c": (-40, 150, " °C"),
    "sm_clock_mhz": (0, 100_000, " MHz"),
    "sm_clock_max_mhz": (0, 100_000, " MHz"),
    "memory_clock_mhz": (0, 100_000, " MHz"),
    "pcie_gen": (0, 16, ""),
    "pcie_gen_max": (0, 16, ""),
    "pcie_width": (0, 64, " lanes"),
    "pcie_width_max": (0, 64, " lanes"),
    "ecc_corrected": (0, 2**64 - 1, ""),
    "ecc_uncorrected": (0, 2**64 - 1, ""),
}
MAX_GPU_INDEX = 4095  # far more GPUs than one host has; bounds a typo's index
MAX_MEMORY_MIB = 2**24  # 16 TiB on one GPU
MAX_PID = 2**22  # Linux's pid_max limit (PID_MAX_LIMIT)
MAX_XID = 65535


def load_host_file(path: str) -> Host:
    """Read and validate a host description; HostFileError lists every problem."""
    where = f"{HOST_FILE_ENV}={path}"
    try:
        raw = read_capped(path)
    except NotAFile as exc:
        raise HostFileError.single(where, f"cannot read the host file: it {exc}") from None
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        raise HostFileError.single(where, f"cannot read the host file: {exc.strerror}") from None
    except OSError as exc:  # permissions, I/O: the file is there but cannot be read
        raise file_error(exc, "read", path) from None
    try:
        doc = parse_json(raw.decode("utf-8"), where)
    except UnicodeDecodeError as exc:
        raise HostFileError.single(where, f"not UTF-8 text (byte {exc.start})") from None
    except YamlSyntaxError as exc:
        raise HostFileError([exc.problem]) from None
    check = Checker(doc)
    host = _host(check, doc.data, source=f"file:{path}")
    if check.problems or host is None:
        raise HostFileError(check.problems)
    return host


def _host(check: Checker, data: Any, source: str) -> Host | None:
    if not isinstance(data, dict):
        check.add((), "expected a JSON object with 'driver' and 'gpus'")
        return None
    check.mapping((), data, (), HOST_KEYS)
    platform = (
        check.choice(("platform",), data["platform"], PLATFORMS) if "platform" in data else None
    )
    driver = check.driver(("driver",), data.get("driver"))
    raw_gpus = data.get("gpus", [])
    if not isinstance(raw_gpus, list):
        check.add(("gpus",), "expected a list of GPUs (a name, or an object with 'name')")
        raw_gpus = []
    gpus = [
        _gpu(check, ("gpus", position), item, position) for position, item in enumerate(raw_gpus)
    ]
    indices: dict[int, int] = {}
    for position, gpu in enumerate(gpus):
        if gpu is not None and gpu.index in indices:
            check.add(
                ("gpus", position), f"has the index {gpu.index} of gpus[{indices[gpu.index]}]"
            )
        elif gpu is not None:
            indices[gpu.index] = position
    if raw_gpus and "driver" not in data:
        check.add((), "GPUs are listed but no 'driver': which driver does that host run?")
    cuda_driver = check.text(("cuda_driver",), data.get("cuda_driver"), nullable=True)
    return Host(
        driver,
        tuple(gpu for gpu in gpus if gpu is not None),
        source,
        cuda_driver,
        note=check.text(("note",), data.get("note"), nullable=True),
        platform=platform,
    )


def _gpu(check: Checker, path: Path, item: Any, position: int) -> Gpu | None:
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict) or "name" not in item:
        check.add(path, "expected a GPU name or an object with at least 'name'")
        return None
    count = len(check.problems)
    check.mapping(path, item, (), GPU_KEYS)
    name = check.text((*path, "name"), item["name"], "a GPU name")
    index = check.whole_number((*path, "index"), item.get("index", position), maximum=MAX_GPU_INDEX)
    cc = check.compute_capability((*path, "compute_capability"), item.get("compute_capability"))
    memory = check.whole_number(
        (*path, "memory_total_mib"), item.get("memory_total_mib"), maximum=MAX_MEMORY_MIB
    )
    numbers: dict[str, Any] = {
        key: check.number((*path, key), item.get(key), RANGES[key][:2], RANGES[key][2])
        for key in (*READINGS, *HEALTH_NUMBERS)
    }
    used = numbers.get("memory_used_mib")
    if used is not None and memory is not None and used > memory:
        check.add(
            (*path, "memory_used_mib"),
            f"{used:g} MiB used is more than the GPU's memory_total_mib ({memory})",
        )
    lost = check.text(
        (*path, "lost"), item.get("lost"), 'a text saying why (e.g. "GPU is lost")', nullable=True
    )
    xids = item.get("xids") or []
    if not isinstance(xids, list) or not all(type(x) is int and 0 <= x <= MAX_XID for x in xids):
        check.add((*path, "xids"), f"expected a list of XID numbers (0 to {MAX_XID})")
    processes = _processes(check, (*path, "processes"), item.get("processes") or [])
    migs = _migs(check, (*path, "mig"), item["mig"]) if "mig" in item else ()
    if len(check.problems) > count or name is None or index is None:
        return None
    return Gpu(
        index=index,
        name=name,
        uuid=check.text((*path, "uuid"), item.get("uuid"), nullable=True),
        compute_capability=cc,
        memory_total_mib=memory,
        brand=check.text((*path, "brand"), item.get("brand"), nullable=True),
        processes=processes,
        pci_bus_id=check.text((*path, "pci_bus_id"), item.get("pci_bus_id"), nullable=True),
        lost=lost,
        xids=tuple(xids),
        mig_mode=True if migs else None,
        mig_devices=migs,
        **numbers,
    )


def _processes(check: Checker, path: Path, raw: Any) -> tuple[GpuProcess, ...]:
    if not isinstance(raw, list):
        check.add(path, "expected a list of {pid, used_memory_mib}")
        return ()
    out = []
    for position, process in enumerate(raw):
        if not isinstance(process, dict) or type(process.get("pid")) is not int:
            check.add((*path, position), "each process needs a numeric 'pid'")
            continue
        if not 0 < process["pid"] <= MAX_PID:
            check.add((*path, position, "pid"), f"expected a process id from 1 to {MAX_PID}")
            continue
        used = check.whole_number(
            (*path, position, "used_memory_mib"),
            process.get("used_memory_mib"),
            maximum=MAX_MEMORY_MIB,
        )
        out.append(GpuProcess(process["pid"], used))
    return tuple(out)


def _migs(check: Checker, path: Path, raw: Any) -> tuple[MigDevice, ...]:
    """A GPU's `mig`: a list of {uuid, profile, memory_total_mib, index, gpu_instance};
    only `uuid` is required, the rest stays unknown."""
    if not isinstance(raw, list):
        check.add(path, 'expected a list of MIG instances ({"uuid": "MIG-…"})')
        return ()
    out: list[MigDevice] = []
    for position, item in enumerate(raw):
        at = (*path, position)
        if not isinstance(item, dict):
            check.add(at, "expected an object with at least 'uuid'")
            continue
        count = len(check.problems)
        check.mapping(at, item, (), MIG_KEYS)
        uuid = item.get("uuid")
        if not isinstance(uuid, str) or not re.match(MIG_UUID, uuid):
            check.add((*at, "uuid"), f"expected a MIG UUID (MIG-…), got {uuid!r}")
        elif any(m.uuid == uuid for m in out):
            check.add((*at, "uuid"), f"{uuid} is listed twice")
        profile = item.get("profile")
        if profile is not None and (not isinstance(profile, str) or not is_mig_profile(profile)):
            check.add((*at, "profile"), f"{profile!r} is not a MIG profile like 1g.10gb")
        memory = check.whole_number((*at, "memory_total_mib"), item.get("memory_total_mib"))
        index = check.whole_number((*at, "index"), item.get("index"))
        gpu_instance = check.whole_number((*at, "gpu_instance"), item.get("gpu_instance"))
        if len(check.problems) > count or not isinstance(uuid, str):
            continue
        out.append(
            MigDevice(
                uuid,
                gpu_instance=gpu_instance,
                memory_total_mib=memory,
                index=index,
                profile=profile,
                profile_source="host file" if profile else None,
            )
        )
    return tuple(out)
