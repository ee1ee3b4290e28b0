"""What a host is, as data: the driver, the GPUs and their live readings. Where they
come from (NVML, nvidia-smi, a host file, flags) is gpuenv.host.detect's business."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpuenv.common.versions import ComputeCapability, DriverVersion, as_written


@dataclass(frozen=True)
class GpuProcess:
    """A process using a GPU, by host PID (NVML's view)."""

    pid: int
    used_memory_mib: int | None = None


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance of a GPU, as NVML (or the host file) lists it.

    `profile` is NVIDIA's name for its size, such as ``1g.10gb`` (``1c.2g.20gb`` where the
    compute instance is smaller than its GPU instance); `profile_source` says how gpuenv
    knows it: ``nvml`` (the GPU-instance profile's own name), ``derived`` (from slice
    counts and memory, the way NVIDIA's go-nvlib names profiles) or ``host file``.
    """

    uuid: str
    gpu_instance: int | None = None
    memory_total_mib: int | None = None
    index: int | None = None  # NVML's MIG device index on its GPU (nvidia-ctk's "<gpu>:<index>")
    profile: str | None = None
    profile_source: str | None = None
    utilization: int | None = None  # percent; NVML usually cannot read it per instance
    processes: tuple[GpuProcess, ...] = ()  # NVML's, through the MIG device's own handle


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str | None = None
    compute_capability: ComputeCapability | None = None
    memory_total_mib: int | None = None
    brand: str | None = None  # NVML's brand (tesla, geforce_rtx, nvidia_rtx, ...)
    # Live state, for reservations and `gpuenv top` (None when unknown).
    utilization: int | None = None  # percent
    memory_used_mib: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    # Health, for `top`, `doctor`, `ps` and the exporter (gpuenv.monitoring.health).
    clocks_event_reasons: int | None = None  # NVML's bit mask of why clocks are held down
    slowdown_temperature_c: int | None = None  # the GPU's own slowdown threshold
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    memory_clock_mhz: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    ecc_corrected: int | None = None  # volatile counts: since the driver was loaded
    ecc_uncorrected: int | None = None
    pci_bus_id: str | None = None
    lost: str | None = None  # why NVML cannot reach the GPU (it fell off the bus)
    xids: tuple[int, ...] = ()  # XID errors NVML reported while gpuenv listened
    mig_mode: bool | None = None
    mig_devices: tuple[MigDevice, ...] = ()

    @property
    def key(self) -> str:
        """How claims and device requests name it: the UUID where known."""
        return self.uuid or str(self.index)

    def mig(self, key: str) -> MigDevice | None:
        """This GPU's MIG instance with UUID `key`, if it has one."""
        return next((m for m in self.mig_devices if m.uuid == key), None)


@dataclass(frozen=True)
class Host:
    """A driver (None when there is none) and the GPUs; `source` says how we know."""

    driver: DriverVersion | None
    gpus: tuple[Gpu, ...] = ()
    source: str = "none"
    cuda_driver: str | None = None  # the newest CUDA the driver supports (NVML)
    note: str | None = None  # why detection found nothing, for `--explain` and doctor
    platform: str | None = None  # linux/amd64 | linux/arm64; None when not known

    @property
    def uuids(self) -> set[str]:
        """The UUIDs of its GPUs and of their MIG instances."""
        return {g.uuid for g in self.gpus if g.uuid} | {
            m.uuid for g in self.gpus for m in g.mig_devices
        }

    def to_data(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "driver": as_written(self.driver),
            "cuda_driver": self.cuda_driver,
            "platform": self.platform,
            "gpus": [_gpu_data(gpu) for gpu in self.gpus],
        }

    def without_driver(self) -> tuple[str, str]:
        """Why no driver is known, and how to give one: a host file that names none is
        not "this host"."""
        if self.source.startswith("file:"):
            path = self.source.removeprefix("file:")
            return f"the host file {path} names no driver", f'add "driver" (and "gpus") to {path}'
        return (
            "no NVIDIA driver on this host",
            "describe the target with --driver/--gpu to plan for it",
        )

    def describe(self) -> str:
        """One line: ``driver 535.104.05, 2× NVIDIA A100-SXM4-80GB (detected through NVML)``."""
        driver = f"driver {self.driver}" if self.driver else "no NVIDIA driver"
        names: dict[str, int] = {}
        for gpu in self.gpus:
            names[gpu.name] = names.get(gpu.name, 0) + 1
        gpus = ", ".join(f"{n}× {name}" if n > 1 else name for name, n in names.items())
        migs = sum(len(gpu.mig_devices) for gpu in self.gpus)
        if migs:
            gpus += f" ({migs} MIG instance{'s' if migs > 1 else ''})"
        how = {
            "nvml": "detected through NVML",
            "nvidia-smi": "detected through nvidia-smi",
            "flags": "described on the command line",
            "none": "detected: no NVIDIA GPU",
            "lock": "as recorded in gpuenv.lock",
        }.get(self.source, f"described in {self.source.removeprefix('file:')}")
        return f"{driver}, {gpus or 'no GPUs'} ({how})"


def _gpu_data(gpu: Gpu) -> dict[str, Any]:
    """A GPU as data: its known fields, the compute capability as written (``8.6``)."""
    data = {k: v for k, v in asdict(gpu).items() if v not in (None, [], ())}
    if gpu.compute_capability is not None:
        data["compute_capability"] = str(gpu.compute_capability)
    return data
