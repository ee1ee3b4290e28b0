"""The matrix data against NVIDIA's documents: one case per corrected or added value.

Each case names the source of its expected value (matrix-audit.md in shared/reference
lists them; [P] an NVIDIA document, [S] image metadata). Every assertion goes through
`load_matrix()`, the loader gpuenv itself uses.
"""

from __future__ import annotations

import pytest

from gpuenv.common.versions import parse_version
from gpuenv.matrix.load import ImageRow, Matrix, load_matrix

REPOSITORIES = {
    "pytorch": "nvcr.io/nvidia/pytorch",
    "tensorflow": "nvcr.io/nvidia/tensorflow",
    "jax": "nvcr.io/nvidia/jax",
    "cuda": "nvcr.io/nvidia/cuda",
}
TAG_SUFFIX = {"pytorch": "-py3", "tensorflow": "-tf2-py3", "jax": "-py3", "cuda": ""}


@pytest.fixture(scope="module")
def shipped() -> Matrix:
    return load_matrix()


def image(matrix: Matrix, framework: str, release: str) -> ImageRow:
    wanted = f"{REPOSITORIES[framework]}:{release}{TAG_SUFFIX[framework]}"
    rows = [row for row in matrix.images if row.image == wanted]
    assert rows, f"no row for {wanted}"
    return rows[0]


def value(row: ImageRow, field: str) -> object:
    """A row's field as the matrix file writes it (driver versions and compute
    capabilities as their text, tuples as lists)."""
    return row.to_data()[field]


NO545 = ["470.57", "525.85", "535.86"]
R1263 = ["470", "535", "550"]  # nvidia/cuda 12.6.3 NVIDIA_REQUIRE_CUDA [S]
R1291 = ["535", "550", "560", "565", "570"]  # nvidia/cuda 12.9.1 NVIDIA_REQUIRE_CUDA [S]
R130 = ["535", "550", "565", "570", "575"]  # nvidia/cuda 13.0.2 NVIDIA_REQUIRE_CUDA [S]
R131 = ["535", "550", "570", "575", "580"]  # nvidia/cuda 13.1.1 NVIDIA_REQUIRE_CUDA [S]
R132 = ["535", "570", "580", "590"]  # nvidia/cuda 13.2.0/13.2.1 NVIDIA_REQUIRE_CUDA [S]

# (framework, release, field, expected, source)
IMAGE_CASES = [
    # 1. forward compatibility
    (
        "pytorch",
        "24.01",
        "forward_compat",
        ["470.57", "525.85", "535.86", "545.23"],
        "Triton rel-24-01 [P]",
    ),
    (
        "pytorch",
        "24.02",
        "forward_compat",
        ["470.57", "525.85", "535.86", "545.23"],
        "Triton rel-24-02 [P]",
    ),
    (
        "pytorch",
        "24.03",
        "forward_compat",
        NO545,
        "R545 not fwd-compat: Triton rel-24-10/25-06 [P]",
    ),
    (
        "pytorch",
        "24.05",
        "forward_compat",
        NO545,
        "R545 not fwd-compat: Triton rel-24-10/25-06 [P]",
    ),
    (
        "pytorch",
        "24.06",
        "forward_compat",
        NO545,
        "R545 not fwd-compat: Triton rel-24-10/25-06 [P]",
    ),
    ("pytorch", "24.07", "forward_compat", NO545, "Triton rel-24-07 [P] minus R545"),
    ("pytorch", "24.10", "forward_compat", NO545, "Triton rel-24-10 [P]: R545 not fwd-compat"),
    ("pytorch", "24.11", "forward_compat", R1263, "nvidia/cuda 12.6.3 REQUIRE [S]"),
    ("pytorch", "24.12", "forward_compat", R1263, "nvidia/cuda 12.6.3 REQUIRE [S]"),
    ("pytorch", "25.01", "forward_compat", NO545, "Triton rel-25-01 [P] minus R545"),
    ("pytorch", "25.02", "forward_compat", NO545, "Triton rel-25-02 [P] minus R545"),
    (
        "pytorch",
        "25.03",
        "forward_compat",
        ["470", "535", "550", "560", "565"],
        "nvidia/cuda 12.8.1 REQUIRE [S]",
    ),
    ("pytorch", "25.04", "forward_compat", NO545, "Triton rel-25-04 [P] minus R545"),
    (
        "pytorch",
        "25.05",
        "forward_compat",
        NO545,
        "Triton rel-25-04/25-06 [P] (25.05 page missing)",
    ),
    ("pytorch", "25.06", "forward_compat", R1291, "nvidia/cuda 12.9.1 REQUIRE [S]"),
    ("pytorch", "25.08", "forward_compat", R130, "nvidia/cuda 13.0.2 REQUIRE [S]"),
    ("pytorch", "25.09", "forward_compat", R130, "nvidia/cuda 13.0.2 REQUIRE [S]"),
    ("pytorch", "25.10", "forward_compat", R130, "nvidia/cuda 13.0.2 REQUIRE [S]"),
    ("pytorch", "25.11", "forward_compat", R130, "nvidia/cuda 13.0.2 REQUIRE [S]"),
    ("pytorch", "25.12", "forward_compat", R131, "nvidia/cuda 13.1.1 REQUIRE [S]"),
    ("pytorch", "26.01", "forward_compat", R131, "nvidia/cuda 13.1.1 REQUIRE [S]"),
    ("pytorch", "26.02", "forward_compat", R131, "nvidia/cuda 13.1.1 REQUIRE [S]"),
    ("pytorch", "26.03", "forward_compat", R132, "nvidia/cuda 13.2.0 REQUIRE [S]"),
    ("pytorch", "26.04", "forward_compat", R132, "nvidia/cuda 13.2.1 REQUIRE [S]"),
    ("pytorch", "26.05", "forward_compat", R132, "nvidia/cuda 13.2.1 REQUIRE [S]"),
    ("pytorch", "26.06", "forward_compat", [], "no CUDA 13.3 REQUIRE string found: unknown"),
    # 2. minimum drivers
    ("pytorch", "24.06", "min_driver", "545", "Triton rel-24-06 [P]"),
    ("pytorch", "24.07", "min_driver", "555", "Triton rel-24-07 [P]"),
    ("pytorch", "25.01", "min_driver", "560", "Triton rel-25-01 [P], >= CUDA 12 floor 525"),
    ("pytorch", "25.02", "min_driver", "560", "Triton rel-25-02 [P], >= CUDA 12 floor 525"),
    ("pytorch", "25.03", "min_driver", "560", "Triton rel-25-03 [P], >= CUDA 12 floor 525"),
    ("pytorch", "25.08", "min_driver", "580", "CUDA 13 floor (Table C.1); notes' 575 is stale"),
    # CUDA patch versions
    ("pytorch", "24.01", "cuda", "12.3.2", "Triton rel-24-01 [P]"),
    ("pytorch", "24.08", "cuda", "12.6.0", "Triton notes / compatibility.md [P]"),
    ("pytorch", "24.09", "cuda", "12.6.1", "Triton notes / compatibility.md [P]"),
    ("pytorch", "24.11", "cuda", "12.6.3", "Triton notes / compatibility.md [P]"),
    ("pytorch", "25.05", "cuda", "12.9.0", "Triton notes / compatibility.md [P]"),
    ("pytorch", "25.09", "cuda", "13.0.1", "Triton notes / compatibility.md [P]"),
    ("pytorch", "25.11", "cuda", "13.0.2", "Triton notes / compatibility.md [P]"),
    ("pytorch", "26.01", "cuda", "13.1.1", "Triton notes / compatibility.md [P]"),
    ("pytorch", "26.02", "cuda", "13.1.1", "Triton notes / compatibility.md [P]"),
    ("pytorch", "26.03", "cuda", "13.2.0", "Triton notes / compatibility.md [P]"),
    ("pytorch", "26.04", "cuda", "13.2.1", "Triton notes / compatibility.md [P]"),
    ("pytorch", "26.05", "cuda", "13.2.1", "Triton notes / compatibility.md [P]"),
    ("pytorch", "26.07", "cuda", "13.3.1", "Triton notes / compatibility.md [P]"),
    ("pytorch", "26.09", "cuda", "13.4.1", "Triton notes / compatibility.md [P]"),
    # 3. missing values
    ("pytorch", "24.08", "cudnn", "9.3.0.75", "matrix-audit 3"),
    ("pytorch", "24.12", "cudnn", "9.6.0.74", "matrix-audit 3"),
    ("pytorch", "25.10", "cudnn", "9.14.0.64", "matrix-audit 3"),
    ("pytorch", "26.07", "cudnn", "9.24.0.43", "matrix-audit 3"),
    ("pytorch", "26.08", "cudnn", "9.25.0.28", "matrix-audit 3"),
    ("pytorch", "23.04", "framework_version", "2.1.0a0+fe05266", "image metadata [S]"),
    ("pytorch", "23.04", "python", "3.8", "image metadata [S]"),
    ("pytorch", "26.10", "cuda", "13.4.3", "Triton rel-26-10 [P]: CUDA 13.4.3.001"),
    ("pytorch", "26.10", "min_compute_capability", "7.5", "Triton rel-26-10 [P]"),
    ("pytorch", "26.10", "framework_version", None, "not found: unknown stays null"),
    ("pytorch", "26.07", "min_compute_capability", "7.5", "Triton rel-26-07 [P]"),
    # TensorFlow
    (
        "tensorflow",
        "24.02",
        "forward_compat",
        ["470.57", "525.85", "535.86", "545.23"],
        "Triton rel-24-02 [P]",
    ),
    ("tensorflow", "25.02", "forward_compat", NO545, "Triton rel-25-02 [P] minus R545"),
    ("tensorflow", "25.02", "min_driver", "560", "Triton rel-25-02 [P]"),
    ("tensorflow", "25.02", "framework_version", "2.17.0", "banner 'NVIDIA Release 25.02-tf2' [S]"),
    ("tensorflow", "25.01", "framework_version", "2.17.0", "matrix-audit 3"),
    ("tensorflow", "25.01", "cudnn", "9.7.0.66", "matrix-audit 3"),
    ("tensorflow", "23.08", "framework_version", None, "TF version not found: null"),
    ("tensorflow", "24.01", "framework_version", "2.14.0", "Jetson wheel 2.14.0+nv24.01 [S]"),
    ("tensorflow", "24.05", "framework_version", "2.15.0", "Jetson wheel 2.15.0+nv24.05 [S]"),
    ("tensorflow", "24.08", "framework_version", "2.16.1", "Jetson wheel 2.16.1+nv24.08 [S]"),
    ("tensorflow", "24.12", "framework_version", "2.17.0", "Jetson wheel 2.17.0+nv24.12 [S]"),
    ("tensorflow", "24.08", "cuda", "12.6.0", "same-month PyTorch base (unverified)"),
    # JAX
    (
        "jax",
        "24.02",
        "forward_compat",
        ["470.57", "525.85", "535.86", "545.23"],
        "Triton rel-24-02 [P]",
    ),
    ("jax", "24.04", "framework_version", "0.4.26", "image metadata [S]"),
    ("jax", "24.10", "framework_version", "0.4.33", "matrix-audit 3 [S]"),
    ("jax", "25.04", "framework_version", "0.5.3", "image metadata [S]"),
    ("jax", "25.08", "forward_compat", R130, "nvidia/cuda 13.0.2 REQUIRE [S]"),
    ("jax", "26.07", "cuda", "13.3.1", "same-month PyTorch base (unverified)"),
]


@pytest.mark.parametrize(
    ("framework", "release", "field", "expected", "source"),
    IMAGE_CASES,
    ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[4]}" for c in IMAGE_CASES],
)
def test_image_value(
    shipped: Matrix, framework: str, release: str, field: str, expected: object, source: str
) -> None:
    assert value(image(shipped, framework, release), field) == expected, source


# (framework, release, field that must be listed unverified, why)
UNVERIFIED_CASES = [
    ("pytorch", "25.08", "forward_compat", "REQUIRE string proven for 13.0.2 only"),
    ("pytorch", "25.09", "forward_compat", "REQUIRE string proven for 13.0.2 only"),
    ("pytorch", "25.12", "forward_compat", "REQUIRE string proven for 13.1.1 only"),
    ("pytorch", "25.05", "forward_compat", "25.05 notes not found"),
    ("pytorch", "26.10", "min_driver", "inferred from the CUDA 13 floor"),
    ("tensorflow", "23.08", "cuda", "copied from the same-month PyTorch row"),
    ("tensorflow", "25.01", "forward_compat", "copied from the same-month PyTorch row"),
    ("tensorflow", "24.05", "framework_version", "Jetson wheel only; dGPU container unconfirmed"),
    ("jax", "24.10", "min_driver", "copied from the same-month PyTorch row"),
    ("jax", "26.07", "cuda", "copied from the same-month PyTorch row"),
]


# Every monthly TF2 tag from 22.01 to 25.02 (matrix-audit 3); none after 25.02 was found.
def test_tensorflow_months(shipped: Matrix) -> None:
    releases = {row.release for row in shipped.images_for("tensorflow")}
    expected = {f"{y}.{m:02d}" for y in (22, 23, 24) for m in range(1, 13)} | {"25.01", "25.02"}
    assert releases == expected


# JAX tags: NVIDIA's JAX release-notes index [P] and tags in use (matrix-audit 3) [S].
def test_jax_tags(shipped: Matrix) -> None:
    releases = {row.release for row in shipped.images_for("jax")}
    assert {"24.10", "25.10", "26.01", "26.03", "26.04", "26.05", "26.06", "26.07"} <= releases


@pytest.mark.parametrize(
    ("framework", "release", "field", "why"),
    UNVERIFIED_CASES,
    ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in UNVERIFIED_CASES],
)
def test_extrapolated_values_are_marked(
    shipped: Matrix, framework: str, release: str, field: str, why: str
) -> None:
    assert field in image(shipped, framework, release).unverified, why


def test_no_r545_forward_compat_from_cuda_12_4(shipped: Matrix) -> None:
    # "users should upgrade from all ... R545 and R555 drivers, which are not
    # forward-compatible with CUDA 12.6" (Triton rel-24-10, rel-25-06 [P]).
    for row in shipped.images:
        if row.cuda and parse_version(row.cuda) >= parse_version("12.4"):
            assert not any(d.branch == 545 for d in row.forward_compat), row.image


def test_every_row_names_its_source(shipped: Matrix) -> None:
    # ImageRow.note holds the row's sources; ImageRow.source is only where it sits (file:line).
    for row in shipped.images:
        assert row.note.strip(), f"{row.source}: {row.image} has no source in `note`"
        assert row.evidence in ("primary", "secondary", "unverified"), row.source
        assert row.source.split(":")[0].endswith(".yaml"), row.source


# (CUDA version, label, min_driver, source)
TOOLKIT_CASES = [
    ("13.4.0", "13.4.0 Developer Preview", "616.00", "CUDA 13.4 notes [P]: 13.4.0 is the preview"),
    ("13.4.1", "13.4 GA", "615", "CUDA 13.4 notes [P]: GA is 13.4.1; R615 (matrix-audit 2)"),
    ("12.3.2", "12.3 Update 2", "545.23.08", "matrix-audit 3"),
    ("12.9.2", "12.9 Update 2", "575.57.08", "matrix-audit 3"),
    ("13.0.3", "13.0 Update 3", "580.126.20", "matrix-audit 3"),
    ("13.1.2", "13.1 Update 2", "590.48.01", "matrix-audit 3"),
    ("13.2.2", "13.2 Update 2", "595.71.05", "matrix-audit 3; NVIDIA repo cuda-compat 595.71.05"),
]


@pytest.mark.parametrize(
    ("cuda", "label", "min_driver", "source"), TOOLKIT_CASES, ids=[c[0] for c in TOOLKIT_CASES]
)
def test_toolkit(shipped: Matrix, cuda: str, label: str, min_driver: str, source: str) -> None:
    toolkit = next((t for t in shipped.toolkits if t.version == cuda), None)
    assert toolkit is not None, source
    assert (toolkit.label, str(toolkit.min_driver)) == (label, min_driver), source


# Plain CUDA images require `cuda>=X.Y` (NVIDIA_REQUIRE_CUDA of nvidia/cuda [S]): a driver of
# the image's CUDA minor runs every patch of it.
PLAIN_CUDA_CASES = [
    ("12.4.1-cudnn-devel-ubuntu22.04", "550.54.14", "12.4 GA driver, not 12.4 U1's 550.54.15"),
    ("12.8.1-cudnn-devel-ubuntu24.04", "570.26", "12.8 GA driver, not 12.8 U1's 570.124.06"),
    ("12.6.3-cudnn-devel-ubuntu22.04", "560.28.03", "12.6 GA driver, not 12.6 U3's 560.35.05"),
    ("13.0.2-cudnn-devel-ubuntu24.04", "580.65.06", "13.0 GA driver, not 13.0 U2's 580.95.05"),
    ("13.2.1-cudnn-devel-ubuntu24.04", "595.45.04", "13.2 GA driver, not 13.2 U1's 595.58.03"),
    ("11.8.0-cudnn8-devel-ubuntu22.04", "520.61.05", "11.8 GA driver"),
]


@pytest.mark.parametrize(
    ("tag", "driver", "why"), PLAIN_CUDA_CASES, ids=[c[0] for c in PLAIN_CUDA_CASES]
)
def test_plain_cuda_minor_rule(shipped: Matrix, tag: str, driver: str, why: str) -> None:
    assert value(image(shipped, "cuda", tag), "min_driver") == driver, why


# brand=tesla/nvidia branches of NVIDIA_REQUIRE_CUDA in nvidia/cuda image configs [S]
PLAIN_FC_CASES = [
    ("12.8.1-cudnn-devel-ubuntu22.04", ["470", "535", "550", "560", "565"]),
    ("13.0.2-cudnn-devel-ubuntu24.04", R130),
    ("13.1.1-cudnn-devel-ubuntu24.04", R131),
    ("13.2.0-cudnn-devel-ubuntu24.04", R132),
    ("13.2.1-cudnn-devel-ubuntu24.04", R132),
    ("12.6.3-cudnn-devel-ubuntu24.04", R1263),
    ("12.9.1-cudnn-devel-ubuntu24.04", R1291),
    ("12.6.0-cudnn-devel-ubuntu24.04", []),  # string not found: unknown
]


@pytest.mark.parametrize(("tag", "expected"), PLAIN_FC_CASES, ids=[c[0] for c in PLAIN_FC_CASES])
def test_plain_cuda_forward_compat(shipped: Matrix, tag: str, expected: list[str]) -> None:
    assert value(image(shipped, "cuda", tag), "forward_compat") == expected


# (NVML name, model, compute capability, class): matrix-audit 4; Jetson names from NVIDIA
# container-toolkit code and nvidia-smi output [S].
GPU_CASES = [
    ("NVIDIA H800", "H800", "9.0", "datacenter"),
    ("NVIDIA H800 PCIe", "H800", "9.0", "datacenter"),
    ("NVIDIA A800-SXM4-80GB", "A800", "8.0", "datacenter"),
    ("NVIDIA A800-SXM4-40GB", "A800", "8.0", "datacenter"),
    ("NVIDIA A800 80GB PCIe", "A800", "8.0", "datacenter"),
    ("NVIDIA A800 40GB Active", "A800 40GB Active", "8.0", "workstation"),
    ("NVIDIA L20", "L20", "8.9", "datacenter"),
    ("NVIDIA L2", "L2", "8.9", "datacenter"),
    ("NVIDIA B100", "B100", "10.0", "datacenter"),
    ("NVIDIA TITAN RTX", "TITAN RTX", "7.5", "consumer"),
    ("NVIDIA GeForce RTX 3050", "RTX 3050", "8.6", "consumer"),
    ("NVIDIA RTX 5880 Ada Generation", "RTX 5880 Ada", "8.9", "workstation"),
    ("Tesla M10", "M10", "5.0", "datacenter"),
    ("Tesla P6", "P6", "6.1", "datacenter"),
    ("Orin (nvgpu)", "Jetson Orin", "8.7", "embedded"),
    ("NVIDIA Tegra Orin (nvgpu)", "Jetson Orin", "8.7", "embedded"),
    ("NVIDIA Thor", "Jetson Thor", "11.0", "embedded"),
]


@pytest.mark.parametrize(
    ("name", "model", "cc", "gpu_class"), GPU_CASES, ids=[c[0] for c in GPU_CASES]
)
def test_gpu(shipped: Matrix, name: str, model: str, cc: str, gpu_class: str) -> None:
    found = shipped.find_gpu(name)
    assert found is not None, name
    assert (found.name, str(found.compute_capability), found.gpu_class) == (model, cc, gpu_class)


def test_low_confidence_gpu_is_marked(shipped: Matrix) -> None:
    found = shipped.find_gpu("NVIDIA L2")
    assert found is not None and found.evidence == "unverified"  # matrix-audit 4: low confidence


def test_every_row_of_every_matrix_file_names_its_source() -> None:
    # The loader keeps `note` for image rows only, so the other kinds are read from the
    # same files load_matrix() reads.
    import glob
    import os

    from gpuenv.common.yamlfile import parse_yaml
    from gpuenv.matrix.load import default_matrix_dir

    kinds = ("images", "minor_version_compat", "toolkits", "compute_capabilities", "models")
    missing = []
    for path in sorted(glob.glob(os.path.join(default_matrix_dir(), "*.yaml"))):
        with open(path, encoding="utf-8") as handle:
            data = parse_yaml(handle.read(), path).data
        for kind in kinds:
            for index, row in enumerate(data.get(kind) or []):
                if not str(row.get("note") or "").strip():
                    missing.append(f"{os.path.basename(path)} {kind}[{index}]")
                if row.get("evidence") not in ("primary", "secondary", "unverified"):
                    missing.append(f"{os.path.basename(path)} {kind}[{index}] evidence")
    assert not missing, missing
