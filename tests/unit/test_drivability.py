"""The GPU must be drivable: a driver branch that predates a GPU's architecture cannot
drive it, whatever the image, and forward compatibility cannot help (it adds newer CUDA
libraries, not support for a newer GPU). Sources: shared/reference/matrix-audit.md §5;
the first-toolkit rule reads `cuda.yaml` (compute_capabilities.added_in, toolkits)."""

from __future__ import annotations

import pytest

from gpuenv.common.versions import ComputeCapability, DriverVersion
from gpuenv.errors import ResolutionError
from gpuenv.host.machine import Gpu, Host
from gpuenv.matrix.load import Matrix
from gpuenv.project.spec import default_spec
from gpuenv.resolution.resolve import classify_gpus, resolve


def _below(driver: DriverVersion) -> DriverVersion:
    """The newest driver of the branch before `driver`'s (e.g. 520.61.05 -> 515.999.99)."""
    return DriverVersion.parse(f"{driver.branch - 5}.999.99")


def _host(
    driver: DriverVersion | str,
    cc: ComputeCapability | str,
    name: str = "Test GPU",
    brand: str | None = None,
) -> Host:
    if isinstance(driver, str):
        driver = DriverVersion.parse(driver)
    if isinstance(cc, str):
        cc = ComputeCapability.parse(cc)
    return Host(driver, (Gpu(0, name, uuid="GPU-0", compute_capability=cc, brand=brand),), "test")


def _architectures(matrix: Matrix) -> list[tuple[ComputeCapability, str, DriverVersion]]:
    """(compute capability, architecture, floor) for every architecture with a floor."""
    out = []
    for arch in matrix.architectures:
        floor = matrix.drive_floor(arch.compute_capability, None)
        if floor is not None:
            out.append((arch.compute_capability, arch.architecture, floor.driver))
    return out


def test_every_architecture_the_matrix_names_since_cuda_11_has_a_floor(matrix: Matrix) -> None:
    with_floor = {cc for cc, _, _ in _architectures(matrix)}
    since_11 = {a.compute_capability for a in matrix.architectures if a.added_in}
    assert since_11 and since_11 <= with_floor


@pytest.mark.parametrize("framework", ["pytorch", "none"])
def test_below_each_architectures_floor_nothing_resolves(matrix: Matrix, framework: str) -> None:
    """Every architecture in the matrix, one branch below its floor and at it."""
    for cc, arch, floor in _architectures(matrix):
        below = _host(_below(floor), cc)
        with pytest.raises(ResolutionError, match="cannot drive") as refused:
            resolve(default_spec(".", framework), matrix, below)
        assert f"R{floor.branch} or newer" in (refused.value.hint or ""), arch
        assert all("cannot drive" in line for line in refused.value.explanation)
        # At the floor itself the drivability check passes (other checks may still refuse).
        (gpu,) = classify_gpus(_host(floor, cc), matrix)
        assert gpu.floor is not None and floor == gpu.floor.driver


@pytest.mark.parametrize(
    ("driver", "gpu", "branch", "source"),
    [
        ("470.256.02", "NVIDIA H100 80GB HBM3", "R520", "sm_90 first in CUDA 11.8 (>= 520.61.05)"),
        ("470.256.02", "NVIDIA L4", "R520", "sm_89 first in CUDA 11.8 (>= 520.61.05)"),
        ("535.216.03", "NVIDIA B200", "R570", "sm_100 first in CUDA 12.8 (>= 570.26)"),
        ("470.256.02", "NVIDIA GeForce RTX 4090", "R520", "sm_89 first in CUDA 11.8"),
    ],
)
def test_a_driver_that_cannot_drive_the_gpu(
    matrix: Matrix, driver: str, gpu: str, branch: str, source: str
) -> None:
    host = Host(DriverVersion.parse(driver), (Gpu(0, gpu),), "test")
    for framework in ("pytorch", "tensorflow", "jax", "none"):
        with pytest.raises(ResolutionError) as refused:
            resolve(default_spec(".", framework), matrix, host)
        assert refused.value.message.startswith(f"this NVIDIA driver ({driver}) cannot drive")
        assert f"upgrade the NVIDIA driver to {branch} or newer" in (refused.value.hint or "")
        assert "forward compatibility cannot help" in (refused.value.hint or ""), source


@pytest.mark.parametrize("driver", ["535.216.03", "570.124.06"])
def test_an_h100_on_a_driver_that_drives_it_gets_an_image(matrix: Matrix, driver: str) -> None:
    host = Host(DriverVersion.parse(driver), (Gpu(0, "NVIDIA H100 80GB HBM3"),), "test")
    chosen = resolve(default_spec(".", "pytorch"), matrix, host)
    assert chosen.row.framework == "pytorch"


def test_hints_never_suggest_a_driver_the_gpu_cannot_use(matrix: Matrix) -> None:
    """An old image pinned on an old driver: the upgrade named is at least Ada's floor."""
    spec = default_spec(".", "pytorch").with_overrides(version="2.4")
    host = Host(DriverVersion.parse("515.105.01"), (Gpu(0, "NVIDIA GeForce RTX 4090"),), "test")
    with pytest.raises(ResolutionError) as refused:
        resolve(spec, matrix, host)
    hint = refused.value.hint or ""
    assert "R520 or newer" in hint


def test_an_unlisted_data_center_gpu_keeps_forward_compatibility(matrix: Matrix) -> None:
    """NVML reports H100-class GPUs with the brand NVIDIA; NVIDIA_REQUIRE_CUDA accepts
    brand=nvidia like brand=tesla (matrix-audit.md §1, §4)."""
    unlisted = _host("535.216.03", "9.0", name="NVIDIA Hxyz 96GB", brand="nvidia")
    (gpu,) = classify_gpus(unlisted, matrix)
    assert gpu.datacenter
    chosen = resolve(default_spec(".", "pytorch"), matrix, unlisted)
    assert chosen.candidate.driver_route.startswith("CUDA forward compatibility")


def test_unknown_products_fall_back_to_their_architectures_floor(matrix: Matrix) -> None:
    host = _host("470.256.02", "9.0", name="NVIDIA Hxyz 96GB", brand="nvidia")
    with pytest.raises(ResolutionError, match="cannot drive the NVIDIA Hxyz 96GB") as refused:
        resolve(default_spec(".", "none"), matrix, host)
    assert "(Hopper, compute capability 9.0): it needs R520" in refused.value.explanation[0]


@pytest.mark.parametrize("name", ["Jetson AGX Orin", "Jetson T5000"])
def test_jetson_gets_a_clear_no_instead_of_a_desktop_image(matrix: Matrix, name: str) -> None:
    host = Host(DriverVersion.parse("540.4.0"), (Gpu(0, name),), "test")
    for framework in ("pytorch", "none"):
        with pytest.raises(ResolutionError) as refused:
            resolve(default_spec(".", framework), matrix, host)
        assert refused.value.message.startswith("NGC dGPU images do not run on Jetson")
        assert "l4t-jetpack" in (refused.value.hint or "")
