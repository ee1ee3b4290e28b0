"""What the matrix holds: image, toolkit, architecture and GPU rows, and the Matrix that
answers the resolver's questions. Frozen and validated: `matrix.load_matrix` makes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from gpuenv.common import cache
from gpuenv.common.versions import ComputeCapability, DriverVersion, parse_version
from gpuenv.matrix.branches import DriverBranch, ForwardSupport
from gpuenv.project.packages import FRAMEWORK_PACKAGES

FRAMEWORK_NAMES = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX", "none": "CUDA"}


# The fields of an image row in a matrix file (every one present, null when unknown).
IMAGE_FIELDS = (
    "tag",
    "release",
    "framework_version",
    "cuda",
    "cudnn",
    "python",
    "ubuntu",
    "min_driver",
    "forward_compat",
    "min_compute_capability",
    "evidence",
    "unverified",
    "note",
)
# Fields a row may leave out (older files, rows whose value nobody knows).
OPTIONAL_IMAGE_FIELDS = ("platforms", "ships", "framework_version_unknown", "caveat")


def record_data(record: Any) -> dict[str, Any]:
    """A matrix record's fields as data (`matrix --json`): driver versions and compute
    capabilities as written, tuples as lists."""
    return {f.name: _plain(getattr(record, f.name)) for f in fields(record)}


def _plain(value: Any) -> Any:
    if isinstance(value, DriverVersion | ComputeCapability):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


# What each evidence level means, as `resolve` and `matrix` say it.
EVIDENCE_WORDS = {
    "primary": "confirmed by NVIDIA's documents",
    "secondary": "from image metadata or other public evidence, not NVIDIA's documents",
    "unverified": "unverified: not confirmed by NVIDIA's documents",
    "image": "read from the image itself",
}


@dataclass(frozen=True)
class ImageRow:
    """One container image and what it needs from a host."""

    framework: str
    family: str
    repository: str
    tag: str
    release: str | None
    framework_version: str | None
    cuda: str | None
    cudnn: str | None
    python: str | None
    ubuntu: str | None
    min_driver: DriverVersion | None
    forward_compat: tuple[DriverVersion, ...]
    min_compute_capability: ComputeCapability | None
    evidence: str
    unverified: tuple[str, ...]
    note: str
    source: str
    platforms: tuple[str, ...] = ()  # linux/amd64, linux/arm64; () when not known
    # (distribution, version) of packages NVIDIA builds into the image besides the
    # framework (torchvision, triton, flash-attn...); absent ones are not known.
    ships: tuple[tuple[str, ...], ...] = ()
    # Why framework_version is null: where it was looked for, and not found
    framework_version_unknown: str = ""
    # What a user of the image must know and do, said whenever the row is chosen (a
    # Docker Hub TensorFlow image whose CUDA is older than its TensorFlow's)
    caveat: str = ""

    def to_data(self) -> dict[str, Any]:
        """Its fields as data: driver versions and compute capabilities as written."""
        return record_data(self)

    def shipped(self, name: str) -> str | None:
        """The version of `name` the image ships: the framework's own, or from `ships`."""
        if FRAMEWORK_PACKAGES.get(name) == self.framework and name not in ("jaxlib",):
            return self.framework_version
        return next((version for package, version in self.ships if package == name), None)

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def label(self) -> str:
        """How people name the row: ``PyTorch 24.05``, or an image without a release by
        its reference (``tensorflow/tensorflow:2.18.0-gpu``)."""
        if self.release:
            return f"{FRAMEWORK_NAMES[self.framework]} {self.release}"
        return self.image.removeprefix("docker.io/")

    @property
    def evidence_text(self) -> str:
        """Where the row's facts come from, for people: ``primary: confirmed by NVIDIA's
        documents (matrix row ngc-pytorch.yaml:546)``."""
        words = EVIDENCE_WORDS.get(self.evidence, self.evidence)
        if not words.startswith(self.evidence):
            words = f"{self.evidence}: {words}"
        if self.source == self.family:  # a base of the team's own: no matrix file has it
            return f"{words} ({self.note})" if self.note else words
        return f"{words} (matrix row {self.source})"

    def sort_key(self) -> tuple[Any, ...]:
        """Newest last: by NGC release, then (for images without one, Docker Hub's) by
        framework version, CUDA, Ubuntu and tag (a -runtime tag after its -devel twin,
        so the smaller image is taken first)."""
        release = tuple(int(p) for p in self.release.split(".")) if self.release else (0,)
        zero = parse_version("0")
        framework = parse_version(self.framework_version) if self.framework_version else zero
        cuda = parse_version(self.cuda) if self.cuda else zero
        ubuntu = parse_version(self.ubuntu) if self.ubuntu else zero
        return (release, framework, cuda, ubuntu, self.tag)


@dataclass(frozen=True)
class Toolkit:
    version: str
    label: str
    min_driver: DriverVersion
    evidence: str

    def to_data(self) -> dict[str, Any]:
        """Its fields as data: driver versions and compute capabilities as written."""
        return record_data(self)


@dataclass(frozen=True)
class Architecture:
    compute_capability: ComputeCapability
    architecture: str
    added_in: str | None
    removed_in: str | None
    evidence: str
    min_driver: DriverVersion | None = None  # where NVIDIA states its first driver
    last_branch: DriverVersion | None = None  # where NVIDIA states the last driving branch

    def to_data(self) -> dict[str, Any]:
        """Its fields as data: driver versions and compute capabilities as written."""
        return record_data(self)


@dataclass(frozen=True)
class GpuModel:
    name: str
    match: tuple[tuple[str, ...], ...]
    compute_capability: ComputeCapability
    gpu_class: str
    architecture: str
    evidence: str
    min_driver: DriverVersion | None = None  # where NVIDIA states a product's own first driver


@dataclass(frozen=True)
class Companion:
    """A release of a companion package and the framework version its own metadata
    requires (torchvision 0.16.0: torch==2.1.0); `requires` None when it names none."""

    package: str
    version: str
    requires: str | None  # a requirement on the framework's package: "torch==2.1.0"
    source: str


@dataclass(frozen=True)
class DriveFloor:
    """The oldest driver that can drive a GPU at all (forward compatibility cannot help
    below it: it adds newer CUDA libraries, not support for a newer GPU)."""

    driver: DriverVersion
    why: str  # where the number comes from, in the user's words ("unverified: ...")


@dataclass(frozen=True)
class DriveCeiling:
    """The last driver branch that drives a GPU: NVIDIA drops old architectures from its
    newer branches (Kepler after R470; Maxwell, Pascal and Volta after R580)."""

    branch: int
    why: str


def name_tokens(name: str) -> tuple[str, ...]:
    """``NVIDIA A100-SXM4-80GB`` -> ``('nvidia', 'a100', 'sxm4', '80gb')``."""
    return tuple(token for token in re.split(r"[\s_-]+", name.lower()) if token)


def _contains(tokens: tuple[str, ...], sequence: tuple[str, ...]) -> bool:
    size = len(sequence)
    return any(tokens[i : i + size] == sequence for i in range(len(tokens) - size + 1))


@dataclass(frozen=True, eq=False)
class Matrix:
    """All matrix data; compared and hashed by identity (caches key on it)."""

    images: tuple[ImageRow, ...]
    minor_compat: tuple[tuple[int, DriverVersion], ...]
    toolkits: tuple[Toolkit, ...]
    architectures: tuple[Architecture, ...]
    gpus: tuple[GpuModel, ...]
    version: str
    directory: str
    # What a user must know of a framework's images as a whole (NVIDIA's last TensorFlow
    # container, say): (framework, text), from the files' `notice`.
    notices: tuple[tuple[str, str], ...] = ()
    companions: tuple[Companion, ...] = ()
    # matrices/driver-branches.yaml: NVIDIA's designation of each driver branch, and the
    # branches its CUDA Compatibility guide lists per cuda-compat package.
    branches: tuple[DriverBranch, ...] = ()
    forward_support: tuple[ForwardSupport, ...] = ()

    def driver_branch(self, branch: int) -> DriverBranch | None:
        """What the lifecycle table records of branch R`branch`, if anything."""
        return next((b for b in self.branches if int(b.branch) == branch), None)

    def forward_support_for(self, cuda: str) -> ForwardSupport | None:
        """The guide's row for the cuda-compat package of `cuda`'s minor, if it has one."""
        minor = ".".join(str(p) for p in parse_version(cuda).release[:2])
        return next((s for s in self.forward_support if s.cuda == minor), None)

    def notice(self, framework: str) -> str | None:
        return next((text for name, text in self.notices if name == framework), None)

    def images_for(self, framework: str, family: str = "ngc") -> list[ImageRow]:
        """The images of one framework, newest first."""
        return [row for row in self.images if row.framework == framework and row.family == family]

    @cached_property
    def _toolkits_by_version(self) -> dict[tuple[int, ...], Toolkit]:
        return {parse_version(t.version).release[:3]: t for t in self.toolkits}

    def toolkit(self, cuda: str) -> Toolkit | None:
        """The toolkit row for a CUDA version: exact x.y.z, else the nearest lower update
        of the same x.y (12.3.2 -> 12.3 Update 1), else that minor's lowest driver."""
        release = tuple(parse_version(cuda).release[:3])
        exact = self._toolkits_by_version.get(release)
        if exact is not None:
            return exact
        same_minor = sorted(
            (key, t) for key, t in self._toolkits_by_version.items() if key[:2] == release[:2]
        )
        lower = [t for key, t in same_minor if key <= release]
        if lower and len(release) >= 3:
            return lower[-1]
        return min((t for _, t in same_minor), key=lambda t: t.min_driver, default=None)

    def toolkit_driver(self, cuda: str) -> DriverVersion | None:
        """The driver the CUDA toolkit of `cuda` needs natively (`toolkit`'s), if known."""
        toolkit = self.toolkit(cuda)
        return toolkit.min_driver if toolkit else None

    def minor_compat_floor(self, cuda: str) -> DriverVersion | None:
        """The lowest driver that runs any CUDA `major`.x application (minor-version compat)."""
        return self._floors.get(parse_version(cuda).release[0])

    @cached_property
    def _floors(self) -> dict[int, DriverVersion]:
        return dict(self.minor_compat)

    def architecture(self, cc: ComputeCapability) -> Architecture | None:
        return next((a for a in self.architectures if a.compute_capability == cc), None)

    def drive_floor(
        self, cc: ComputeCapability | None, model: GpuModel | None
    ) -> DriveFloor | None:
        """The GPU's driver floor: its product's stated minimum, else its architecture's,
        else the driver of the first CUDA toolkit that builds for its compute capability.
        None when not known (architectures older than the toolkits the matrix lists)."""
        if model is not None and model.min_driver:
            return DriveFloor(model.min_driver, f"NVIDIA's minimum for the {model.name}")
        arch = self.architecture(cc) if cc else None
        if arch is None:
            return None
        if arch.min_driver:
            why = f"NVIDIA's minimum for {arch.architecture} GPUs"
            return DriveFloor(arch.min_driver, why)
        first = self.toolkit(arch.added_in) if arch.added_in else None
        if first is None:
            return None
        why = (
            f"unverified: inferred from CUDA {arch.added_in}, the first CUDA toolkit that "
            f"builds for compute capability {arch.compute_capability}"
        )
        return DriveFloor(first.min_driver, why)

    def drive_ceiling(self, cc: ComputeCapability | None) -> DriveCeiling | None:
        """The last branch that drives the architecture of `cc`, where NVIDIA states it."""
        arch = self.architecture(cc) if cc else None
        if arch is None or arch.last_branch is None:
            return None
        why = "NVIDIA's driver deprecation schedule, as matrices/cuda.yaml records it"
        return DriveCeiling(arch.last_branch.branch, why)

    def find_gpu(self, name: str) -> GpuModel | None:
        """The model a GPU name refers to (NVML's or a short one); longest match wins."""
        tokens = name_tokens(name)
        best: tuple[int, GpuModel] | None = None
        for model in self.gpus:
            for sequence in model.match:
                if _contains(tokens, sequence) and (best is None or len(sequence) > best[0]):
                    best = (len(sequence), model)
        return best[1] if best else None

    def frameworks(self) -> list[str]:
        return sorted({row.framework for row in self.images})


_DATA_KEYS = frozenset(
    {
        "images",
        "minor_compat",
        "toolkits",
        "architectures",
        "gpus",
        "version",
        "notices",
        "companions",
        "branches",
        "forward_support",
    }
)


def matrix_to_data(matrix: Matrix) -> dict[str, Any]:
    """The matrix as data `cache.store` takes (rows go as lists of their fields)."""
    return {
        "images": matrix.images,
        "minor_compat": matrix.minor_compat,
        "toolkits": matrix.toolkits,
        "architectures": matrix.architectures,
        "gpus": matrix.gpus,
        "version": matrix.version,
        "notices": [list(pair) for pair in matrix.notices],
        "companions": matrix.companions,
        "branches": matrix.branches,
        "forward_support": matrix.forward_support,
    }


def matrix_from_data(data: Any, directory: str) -> Matrix:
    """Rebuild a Matrix from `matrix_to_data`'s output (as `cache.load` returns it);
    ValueError or TypeError when the data does not have its shape."""
    if not isinstance(data, dict) or data.keys() != _DATA_KEYS:
        raise ValueError("not matrix data")
    return Matrix(
        images=cache.rows(ImageRow, data["images"]),
        minor_compat=tuple(
            (cache.checked(int, major), DriverVersion.parse(cache.checked(str, driver)))
            for major, driver in cache.checked(list, data["minor_compat"])
        ),
        toolkits=cache.rows(Toolkit, data["toolkits"]),
        architectures=cache.rows(Architecture, data["architectures"]),
        gpus=cache.rows(GpuModel, data["gpus"]),
        version=cache.checked(str, data["version"]),
        directory=directory,
        notices=tuple(
            (cache.checked(str, name), cache.checked(str, text))
            for name, text in cache.checked(list, data["notices"])
        ),
        companions=cache.rows(Companion, data["companions"]),
        branches=cache.rows(DriverBranch, data["branches"]),
        forward_support=cache.rows(ForwardSupport, data["forward_support"]),
    )
