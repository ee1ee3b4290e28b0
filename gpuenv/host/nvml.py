"""The host as NVML sees it, through NVIDIA's bindings (nvidia-ml-py).

Each reading a GPU does not support is left unknown; a GPU NVML cannot reach (fallen off
the bus: NVML_ERROR_GPU_IS_LOST) is still listed, marked lost, so one bad card never
hides the others. The tests run all of this against a scripted libnvidia-ml.so.1
(tests/nvml/), through these same calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from gpuenv.common.versions import ComputeCapability, DriverVersion, InvalidDriverVersion
from gpuenv.host.machine import Gpu, GpuProcess, Host, MigDevice

# Errors that mean "this GPU is unusable", not "this reading is unsupported".
_GONE = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _brands(pynvml: Any) -> dict[int, str]:
    return {
        getattr(pynvml, name): name.removeprefix("NVML_BRAND_").lower()
        for name in dir(pynvml)
        if name.startswith("NVML_BRAND_") and name != "NVML_BRAND_COUNT"
    }


def _gone(pynvml: Any, exc: Exception) -> bool:
    return any(getattr(exc, "value", None) == getattr(pynvml, name, -1) for name in _GONE)


@contextlib.contextmanager
def session(pynvml: Any) -> Iterator[None]:
    """nvmlInit … nvmlShutdown (NVML counts them: a long-lived caller may hold one open)."""
    pynvml.nvmlInit()
    try:
        yield
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def detect_nvml(xids: Callable[[int], tuple[int, ...]] | None = None) -> Host | str:
    """The host as NVML sees it, or the reason NVML is not usable. `xids` gives the XID
    errors seen on a GPU index (the exporter listens for them; a snapshot cannot)."""
    try:
        import pynvml  # ~30 ms: loaded when a host is detected, not by every command
    except ImportError:
        return "the NVML bindings (nvidia-ml-py) are not installed"
    try:
        with session(pynvml):
            driver = DriverVersion.parse(_text(pynvml.nvmlSystemGetDriverVersion()))
            try:
                cuda_int = pynvml.nvmlSystemGetCudaDriverVersion_v2()
                cuda_driver: str | None = f"{cuda_int // 1000}.{(cuda_int % 1000) // 10}"
            except pynvml.NVMLError:
                cuda_driver = None
            brands = _brands(pynvml)
            gpus = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    gpu = _gpu(pynvml, index, brands)
                except pynvml.NVMLError as exc:
                    if not _gone(pynvml, exc):
                        raise
                    gpu = Gpu(index, "unknown (lost)", lost=str(exc))
                if xids is not None:
                    gpu = replace(gpu, xids=xids(index))
                gpus.append(gpu)
            return Host(driver, tuple(gpus), "nvml", cuda_driver)
    except (pynvml.NVMLError, InvalidDriverVersion) as exc:
        return f"NVML: {exc}"


def _gpu(pynvml: Any, index: int, brands: dict[int, str]) -> Gpu:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(pynvml.nvmlDeviceGetName(handle))
    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    state = _readings(pynvml, handle)
    try:
        brand: str | None = brands.get(pynvml.nvmlDeviceGetBrand(handle))
    except pynvml.NVMLError as exc:
        if _gone(pynvml, exc):
            raise
        brand = None
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return Gpu(
        index=index,
        name=name,
        uuid=uuid,
        compute_capability=ComputeCapability(int(major), int(minor)),
        memory_total_mib=int(memory.total) // 2**20,
        brand=brand,
        memory_used_mib=int(memory.used) // 2**20,
        processes=_processes(pynvml, handle),
        mig_devices=_mig_devices(pynvml, handle, state.get("mig_mode")),
        **state,
    )


def _readings(pynvml: Any, handle: Any) -> dict[str, Any]:
    """Every reading this GPU supports; a lost GPU raises, an unsupported one is skipped."""
    sensor, threshold = pynvml.NVML_TEMPERATURE_GPU, pynvml.nvmlDeviceGetTemperatureThreshold
    clock, max_clock = pynvml.nvmlDeviceGetClockInfo, pynvml.nvmlDeviceGetMaxClockInfo
    ecc = pynvml.nvmlDeviceGetTotalEccErrors
    readers: dict[str, Callable[[], Any]] = {
        "utilization": lambda: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        "temperature_c": lambda: int(pynvml.nvmlDeviceGetTemperature(handle, sensor)),
        "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
        "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        "clocks_event_reasons": lambda: int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
        "slowdown_temperature_c": lambda: int(
            threshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        ),
        "sm_clock_mhz": lambda: int(clock(handle, pynvml.NVML_CLOCK_SM)),
        "sm_clock_max_mhz": lambda: int(max_clock(handle, pynvml.NVML_CLOCK_SM)),
        "memory_clock_mhz": lambda: int(clock(handle, pynvml.NVML_CLOCK_MEM)),
        "pcie_gen": lambda: int(pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        "pcie_gen_max": lambda: int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        "pcie_width": lambda: int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        "pcie_width_max": lambda: int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        "ecc_corrected": lambda: int(
            ecc(handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)
        ),
        "ecc_uncorrected": lambda: int(
            ecc(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        ),
        "pci_bus_id": lambda: _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
        "mig_mode": lambda: pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE,
    }
    state: dict[str, Any] = {}
    for key, read in readers.items():
        try:
            state[key] = read()
        except pynvml.NVMLError as exc:
            if _gone(pynvml, exc):
                raise
    return state


def _processes(pynvml: Any, handle: Any) -> tuple[GpuProcess, ...]:
    processes = []
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        with contextlib.suppress(pynvml.NVMLError, AttributeError):
            for process in getattr(pynvml, getter)(handle):
                used = getattr(process, "usedGpuMemory", None)
                processes.append(GpuProcess(int(process.pid), int(used) // 2**20 if used else None))
    return tuple(processes)


def _mig_devices(pynvml: Any, handle: Any, enabled: bool | None) -> tuple[MigDevice, ...]:
    """The MIG instances of a GPU in MIG mode, by MIG index (NVML lists up to the max)."""
    if not enabled:
        return ()
    devices = []
    total_mib: int | None = None
    with contextlib.suppress(pynvml.NVMLError):
        total_mib = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) >> 20
    with contextlib.suppress(pynvml.NVMLError):
        for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except pynvml.NVMLError_NotFound:
                continue
            devices.append(_mig_device(pynvml, handle, mig, index, total_mib))
    return tuple(devices)


def _mig_device(pynvml: Any, parent: Any, mig: Any, index: int, total_mib: int | None) -> MigDevice:
    values: dict[str, Any] = {"index": index}
    readers: dict[str, Callable[[], Any]] = {
        "gpu_instance": lambda: int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
        "memory_total_mib": lambda: int(pynvml.nvmlDeviceGetMemoryInfo(mig).total) >> 20,
        # Usually NOT_SUPPORTED on a MIG device: then unknown, never 0 %.
        "utilization": lambda: int(pynvml.nvmlDeviceGetUtilizationRates(mig).gpu),
    }
    for key, read in readers.items():
        with contextlib.suppress(pynvml.NVMLError):
            values[key] = read()
    values["processes"] = _processes(pynvml, mig)
    profile = _profile(pynvml, parent, mig, values.get("gpu_instance"), total_mib)
    if profile is not None:
        values["profile"], values["profile_source"] = profile
    return MigDevice(_text(pynvml.nvmlDeviceGetUUID(mig)), **values)


def _profile(
    pynvml: Any, parent: Any, mig: Any, gpu_instance: int | None, total_mib: int | None
) -> tuple[str, str] | None:
    """The instance's profile name and how it is known (see `mig_profile`)."""
    compute_slices = gpu_slices = memory_mb = None
    with contextlib.suppress(pynvml.NVMLError, AttributeError):
        attributes = pynvml.nvmlDeviceGetAttributes(mig)
        gpu_slices = int(attributes.gpuInstanceSliceCount)
        compute_slices = int(attributes.computeInstanceSliceCount)
        memory_mb = int(attributes.memorySizeMB)
    if gpu_instance is not None:
        with contextlib.suppress(pynvml.NVMLError, AttributeError):
            instance = pynvml.nvmlDeviceGetGpuInstanceById(parent, gpu_instance)
            profile_id = pynvml.nvmlGpuInstanceGetInfo(instance).profileId
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfoById(parent, profile_id)
            name = _text(info.name).strip().removeprefix("MIG ").strip()
            if name:
                ci = compute_slices if compute_slices and compute_slices != info.sliceCount else 0
                return (f"{ci}c.{name}" if ci else name), "nvml"
    if gpu_slices and memory_mb and total_mib:
        name = mig_profile(gpu_slices, compute_slices or gpu_slices, memory_mb, total_mib)
        return name, "derived"
    return None


def mig_profile(gpu_slices: int, compute_slices: int, memory_mb: int, total_mib: int) -> str:
    """A MIG profile's name from its slices and memory, as NVIDIA's go-nvlib names it
    (pkg/nvlib/device/mig_device.go `GetProfile` passes the MIG device's attributes'
    memorySizeMB and the parent's total memory to mig_profile.go, whose
    `getMigMemorySizeGB` takes the instance's share of the GPU's memory rounded up to
    eighths, times the GPU's memory in whole GiB). go-nvlib adds engine suffixes (+me)
    from the compute-instance engine profile, which this cannot see.

    >>> mig_profile(1, 1, 9728, 81920), mig_profile(3, 3, 40192, 81559)
    ('1g.10gb', '3g.40gb')
    >>> mig_profile(2, 1, 19968, 81920)
    '1c.2g.20gb'
    """
    eighths = math.ceil(memory_mb / total_mib * 8) / 8
    memory_gb = round(eighths * math.ceil(total_mib / 1024))
    name = f"{gpu_slices}g.{memory_gb}gb"
    return f"{compute_slices}c.{name}" if compute_slices != gpu_slices else name


class NvmlListener:
    """A long-lived NVML session (the exporter's): NVML stays initialized between
    readings, and XID errors are counted as NVML reports them (an event set on every GPU
    that supports XID events; a snapshot cannot see past ones)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int], int] = {}
        self.last_xid: dict[int, int] = {}  # GPU index -> the XID NVML reported last
        self.note: str | None = None
        self._pynvml: Any = None
        self._events: Any = None
        self._indices: dict[int, int] = {}  # handle address -> GPU index

    def start(self) -> None:
        try:
            import pynvml  # ~30 ms: loaded when a host is detected, not by every command
        except ImportError:
            self.note = "the NVML bindings (nvidia-ml-py) are not installed"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.note = f"NVML: {exc}"
            return
        self._pynvml = pynvml
        with contextlib.suppress(pynvml.NVMLError):
            self._events = pynvml.nvmlEventSetCreate()
            for index in range(pynvml.nvmlDeviceGetCount()):
                with contextlib.suppress(pynvml.NVMLError):
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                    pynvml.nvmlDeviceRegisterEvents(
                        handle, pynvml.nvmlEventTypeXidCriticalError, self._events
                    )
                    self._indices[_address(handle)] = index

    def drain(self) -> None:
        """Count the XID events that arrived since the last call (never waits)."""
        pynvml = self._pynvml
        if pynvml is None or self._events is None:
            return
        while True:
            try:
                event = pynvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError:
                return
            index = self._indices.get(_address(event.device))
            if index is not None and event.eventType & pynvml.nvmlEventTypeXidCriticalError:
                key = (index, int(event.eventData))
                self.counts[key] = self.counts.get(key, 0) + 1
                self.last_xid[index] = key[1]

    def xids(self, index: int) -> tuple[int, ...]:
        return tuple(sorted(xid for (gpu, xid) in self.counts if gpu == index))

    def stop(self) -> None:
        pynvml = self._pynvml
        if pynvml is None:
            return
        with contextlib.suppress(pynvml.NVMLError):
            if self._events is not None:
                pynvml.nvmlEventSetFree(self._events)
            pynvml.nvmlShutdown()
        self._pynvml = None


def _address(handle: Any) -> int:
    """What a device handle points to: two handles of one GPU point to the same."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
