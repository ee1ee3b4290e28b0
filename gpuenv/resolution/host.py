"""What this machine has: the NVIDIA driver and every GPU, read through NVML.

NVML (nvidia-ml-py) is the source; `nvidia-smi --query-gpu` is the fallback where the
Python bindings cannot load the library; a machine with neither is a valid host with no
GPUs. To plan for another machine (and to test), a host can be described instead: by
flags (`--driver`, `--gpu`) or by the JSON file named in GPUENV_HOST_FILE.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpuenv.errors import HostError, UsageError, file_error

# The data types live in gpuenv.resolution.machine; most callers import them from here.
from gpuenv.resolution.machine import Gpu as Gpu
from gpuenv.resolution.machine import GpuProcess as GpuProcess
from gpuenv.resolution.machine import Host as Host
from gpuenv.resolution.machine import MigDevice as MigDevice

if TYPE_CHECKING:
    from gpuenv.resolution.matrix import Matrix

HOST_FILE_ENV = "GPUENV_HOST_FILE"
NVIDIA_SMI_FIELDS = ("index", "uuid", "name", "compute_cap", "memory.total", "driver_version")


def parse_nvidia_smi(output: str, fields: Sequence[str] = NVIDIA_SMI_FIELDS) -> Host:
    """Parse `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` output."""
    import csv
    import io

    gpus = []
    driver = None
    for row in csv.reader(io.StringIO(output), skipinitialspace=True):
        if not row:
            continue
        values = dict(zip(fields, (cell.strip() for cell in row), strict=False))
        driver = values.get("driver_version") or driver
        cc = values.get("compute_cap")
        memory = values.get("memory.total", "")
        gpus.append(
            Gpu(
                index=int(values["index"]),
                name=values["name"],
                uuid=values.get("uuid") or None,
                compute_capability=cc if cc and cc[0].isdigit() else None,
                memory_total_mib=int(float(memory)) if memory.replace(".", "").isdigit() else None,
            )
        )
    return Host(driver, tuple(gpus), "nvidia-smi")


def detect_nvidia_smi() -> Host | str:
    """The host through nvidia-smi; older versions lack compute_cap, so retry without it."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi is not on PATH"
    for fields in (NVIDIA_SMI_FIELDS, tuple(f for f in NVIDIA_SMI_FIELDS if f != "compute_cap")):
        try:
            result = subprocess.run(
                [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"nvidia-smi failed: {exc}"
        if result.returncode == 0:
            try:
                return parse_nvidia_smi(result.stdout, fields)
            except (KeyError, ValueError) as exc:
                return f"nvidia-smi printed something unexpected ({exc})"
    return f"nvidia-smi failed: {(result.stderr or result.stdout).strip()[:200]}"


def detect_host() -> Host:
    """This machine, or the one described by GPUENV_HOST_FILE. Never raises for "no GPU"."""
    from gpuenv.common.platforms import this_platform

    described = os.environ.get(HOST_FILE_ENV)
    if described:
        return load_host_file(described)
    from gpuenv.resolution.nvml import detect_nvml

    reasons = []
    for detect in (detect_nvml, detect_nvidia_smi):
        found = detect()
        if isinstance(found, Host):
            return replace(found, platform=this_platform())
        reasons.append(found)
    return Host(None, (), "none", note="; ".join(reasons), platform=this_platform())


def _check_driver(driver: Any, where: str) -> str | None:
    from gpuenv.common.versions import InvalidDriverVersion, driver_tuple

    if driver is None:
        return None
    if not isinstance(driver, str):
        raise HostError(f"{where}: 'driver' must be a quoted version like \"535.104.05\"")
    try:
        driver_tuple(driver)
    except InvalidDriverVersion as exc:
        raise HostError(f"{where}: {exc}") from None
    return driver


def load_host_file(path: str) -> Host:
    """Read a host description (docs/reference/host.md)."""
    where = f"{HOST_FILE_ENV}={path}"
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        raise HostError(f"{where}: cannot read the host file: {exc.strerror}") from None
    except OSError as exc:  # permissions, I/O: the file is there but cannot be read
        raise file_error(exc, "read", path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HostError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HostError(f"{where}: expected a JSON object with 'driver' and 'gpus'")
    unknown = set(data) - {"driver", "cuda_driver", "gpus", "note", "platform"}
    if unknown:
        raise HostError(
            f"{where}: unknown keys {', '.join(sorted(unknown))} "
            "(known: driver, cuda_driver, gpus, note, platform)"
        )
    platform = check_platform(data.get("platform"), f"{where}: 'platform'")
    driver = _check_driver(data.get("driver"), where)
    raw_gpus = data.get("gpus", [])
    if not isinstance(raw_gpus, list):
        raise HostError(f"{where}: 'gpus' must be a list")
    gpus = []
    for position, item in enumerate(raw_gpus):
        gpus.append(_gpu_from_data(item, position, f"{where}: gpus[{position}]"))
    indices = [gpu.index for gpu in gpus]
    if len(set(indices)) != len(indices):
        raise HostError(f"{where}: two GPUs have the same index")
    if gpus and driver is None:
        raise HostError(f"{where}: GPUs are listed but no 'driver'")
    return Host(driver, tuple(gpus), f"file:{path}", data.get("cuda_driver"), platform=platform)


def check_platform(value: Any, where: str) -> str | None:
    """A platform gpuenv knows (linux/amd64, linux/arm64), or None when not given."""
    from gpuenv.common.platforms import PLATFORMS

    if value is None:
        return None
    if value not in PLATFORMS:
        raise HostError(f"{where} {value!r} is not one of {', '.join(PLATFORMS)}")
    return str(value)


# Health readings a host file may describe too (docs/reference/host.md).
HEALTH_NUMBERS = (
    "clocks_event_reasons",
    "slowdown_temperature_c",
    "shutdown_temperature_c",
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
_GPU_KEYS = {
    "index",
    "name",
    "uuid",
    "compute_capability",
    "memory_total_mib",
    "brand",
    "utilization",
    "memory_used_mib",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "processes",
    *HEALTH_NUMBERS,
    "pci_bus_id",
    "lost",
    "xids",
    "mig",
}


def _gpu_from_data(item: Any, position: int, where: str) -> Gpu:
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise HostError(f"{where}: expected a GPU name or an object with at least 'name'")
    unknown = set(item) - _GPU_KEYS
    if unknown:
        raise HostError(
            f"{where}: unknown keys {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(_GPU_KEYS))})"
        )
    from gpuenv.common.versions import InvalidComputeCapability, compute_capability

    cc = item.get("compute_capability")
    if cc is not None:
        try:
            compute_capability(str(cc))
        except InvalidComputeCapability as exc:
            raise HostError(f"{where}: {exc}") from None
    index = item.get("index", position)
    memory = item.get("memory_total_mib")
    if not isinstance(index, int) or index < 0:
        raise HostError(f"{where}: 'index' must be a whole number ≥ 0")
    if memory is not None and not isinstance(memory, int):
        raise HostError(f"{where}: 'memory_total_mib' must be a whole number")
    numbers: dict[str, Any] = {}
    for key in (
        "utilization",
        "memory_used_mib",
        "temperature_c",
        "power_w",
        "power_limit_w",
        *HEALTH_NUMBERS,
    ):
        value = item.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise HostError(f"{where}: '{key}' must be a number")
        numbers[key] = value
    lost, xids = item.get("lost"), item.get("xids") or []
    if lost is not None and not isinstance(lost, str):
        raise HostError(f"{where}: 'lost' must be a text saying why (e.g. \"GPU is lost\")")
    if not isinstance(xids, list) or not all(type(x) is int for x in xids):
        raise HostError(f"{where}: 'xids' must be a list of XID numbers")
    processes = []
    raw_processes = item.get("processes") or []
    if not isinstance(raw_processes, list):
        raise HostError(f"{where}: 'processes' must be a list of {{pid, used_memory_mib}}")
    for process in raw_processes:
        if not isinstance(process, dict) or not isinstance(process.get("pid"), int):
            raise HostError(f"{where}: each process needs a numeric 'pid'")
        processes.append(GpuProcess(process["pid"], process.get("used_memory_mib")))
    migs: tuple[MigDevice, ...] = ()
    if "mig" in item:
        from gpuenv.resolution.mig import migs_from_data

        migs = migs_from_data(item["mig"], where)
    return Gpu(
        index=index,
        name=item["name"],
        uuid=item.get("uuid"),
        compute_capability=str(cc) if cc is not None else None,
        memory_total_mib=memory,
        brand=item.get("brand"),
        processes=tuple(processes),
        pci_bus_id=item.get("pci_bus_id"),
        lost=lost,
        xids=tuple(xids),
        mig_mode=True if migs else None,
        mig_devices=migs,
        **numbers,
    )


def describe_host(driver: str | None, models: Sequence[str], matrix: Matrix) -> Host:
    """A planned host from `--driver` and `--gpu MODEL` flags, GPUs looked up in the matrix.
    A bad flag value is a UsageError (exit 2), whatever the flag."""
    try:
        checked = _check_driver(driver, "--driver")
    except HostError as exc:
        raise UsageError(exc.message, hint="give the driver as `nvidia-smi` prints it") from None
    gpus = []
    for index, name in enumerate(models):
        model = matrix.find_gpu(name)
        if model is None:
            import difflib

            names = [m.name for m in matrix.gpus]
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UsageError(
                f"--gpu {name!r}: not a GPU model gpuenv knows.{hint} "
                "`gpuenv matrix gpus` lists them."
            )
        gpus.append(Gpu(index=index, name=model.name, compute_capability=model.compute_capability))
    if gpus and checked is None:
        raise UsageError("--gpu needs --driver too: which driver will that host run?")
    return Host(checked, tuple(gpus), "flags")


@dataclass(frozen=True)
class HostOverride:
    """The host flags a command was given (empty: detect this machine)."""

    driver: str | None = None
    gpus: tuple[str, ...] = field(default_factory=tuple)

    @property
    def given(self) -> bool:
        return self.driver is not None or bool(self.gpus)


def host_for(override: HostOverride, matrix: Matrix) -> Host:
    """The host a command plans for: described by flags, else GPUENV_HOST_FILE, else detected."""
    if override.given:
        return describe_host(override.driver, override.gpus, matrix)
    return detect_host()


@dataclass(frozen=True)
class HostPlan:
    """The host to plan for: --driver/--gpu when given, else this machine."""

    driver: str | None = None
    gpu_models: tuple[str, ...] = ()
    platform: str | None = None  # --platform; a described host's is unknown without it

    @property
    def given(self) -> bool:
        return self.driver is not None or bool(self.gpu_models) or self.platform is not None

    def host(self, matrix: Matrix) -> Host:

        host = host_for(HostOverride(self.driver, self.gpu_models), matrix)
        if self.platform is not None:
            host = replace(host, platform=check_platform(self.platform, "--platform"))
        return host
