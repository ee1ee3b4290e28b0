"""What a resolution is made of, as data: the host's GPUs as the matrix sees them, each
image's verdict (its rejections, or how the driver qualifies), and the chosen one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuenv.common.versions import ComputeCapability, DriverVersion, as_written
from gpuenv.host.machine import Gpu, Host
from gpuenv.matrix.model import DriveCeiling, DriveFloor, ImageRow
from gpuenv.project.spec import Spec


@dataclass(frozen=True)
class HostGpu:
    """A host GPU with what the matrix adds: compute capability and class."""

    gpu: Gpu
    compute_capability: ComputeCapability | None
    gpu_class: str | None  # datacenter | workstation | consumer | embedded | None (unknown)
    floor: DriveFloor | None = None  # the oldest driver that can drive it, where known
    architecture: str | None = None
    ceiling: DriveCeiling | None = None  # the last branch that drives it, where known

    @property
    def name(self) -> str:
        return self.gpu.name

    def past_last_branch(self, driver: DriverVersion | None) -> bool:
        """Whether `driver`'s branch comes after the last one that drives this GPU."""
        return bool(driver and self.ceiling and driver.branch > self.ceiling.branch)

    @property
    def datacenter(self) -> bool:
        return self.gpu_class == "datacenter"


@dataclass(frozen=True)
class Rejection:
    check: str  # version | python | cuda | driver | gpu
    reason: str


@dataclass(frozen=True, slots=True)
class Candidate:
    """One image's verdict (the resolver makes one per matrix row)."""

    row: ImageRow
    rejections: tuple[Rejection, ...]
    min_driver: DriverVersion | None
    driver_route: str | None  # how the host driver qualifies, when it does
    # native | minor-version compatibility | forward compatibility; None: not checked
    mode: str | None = None
    # False for a forward route NVIDIA's documents disagree on, or are silent about
    route_verified: bool = True

    @property
    def ok(self) -> bool:
        return not self.rejections

    def rejected_by(self, *checks: str) -> bool:
        return any(r.check in checks for r in self.rejections)

    def only_rejected_by(self, *checks: str) -> bool:
        return bool(self.rejections) and all(r.check in checks for r in self.rejections)


@dataclass(frozen=True)
class Resolution:
    spec: Spec
    host: Host
    candidate: Candidate
    candidates: tuple[Candidate, ...]
    gpus: tuple[HostGpu, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def row(self) -> ImageRow:
        return self.candidate.row

    @property
    def required_compute_capabilities(self) -> tuple[str, ...]:
        """The host GPUs' compute capabilities as written (``8.6``), in the order locks
        have always listed them (as text: ``12.0`` before ``8.6``), so a re-lock on the
        same host writes the same lock."""
        return tuple(sorted({str(g.compute_capability) for g in self.gpus if g.compute_capability}))

    def to_data(self) -> dict[str, Any]:
        row = self.row
        return {
            "image": row.image,
            "repository": row.repository,
            "tag": row.tag,
            "release": row.release,
            "framework": row.framework,
            "framework_version": row.framework_version,
            "cuda": row.cuda,
            "cudnn": row.cudnn,
            "python": row.python,
            "ubuntu": row.ubuntu,
            "min_driver": as_written(self.candidate.min_driver),
            "forward_compat": [str(driver) for driver in row.forward_compat],
            "min_compute_capability": as_written(row.min_compute_capability),
            "evidence": row.evidence,
            "unverified": list(row.unverified),
            "driver_route": self.candidate.driver_route,
            "compatibility_mode": self.candidate.mode,
            "route_verified": self.candidate.route_verified,
            "warnings": list(self.warnings),
            "host": self.host.to_data(),
        }
