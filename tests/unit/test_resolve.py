from __future__ import annotations

from typing import Any

import pytest

from gpuenv.common.versions import ComputeCapability, DriverVersion
from gpuenv.errors import ResolutionError
from gpuenv.host.machine import Gpu, Host
from gpuenv.matrix.load import Matrix
from gpuenv.project.spec import GpuRequest, Spec, default_spec
from gpuenv.resolution.resolve import _cuda_supports, resolve

from ..conftest import make_host


def spec(framework: str = "pytorch", **fields: Any) -> Spec:
    return default_spec("/tmp/project", framework).with_overrides(**fields)


# (spec fields, host, expected image tag, expected driver route fragment)
CASES = [
    # The newest image whose PyTorch version the matrix records (26.10's is not).
    pytest.param({}, make_host(None), "26.09-py3", "not checked", id="no-gpu-host-newest"),
    pytest.param(
        {"version": "2.4"},
        make_host("550.54.15", "NVIDIA GeForce RTX 4090"),
        "24.06-py3",  # 545 or later (Triton rel-24-06)
        "≥ 545",
        id="consumer-meets-minimum",
    ),
    pytest.param(
        {"version": "2.4"},
        make_host("535.104.05", "NVIDIA A100-SXM4-80GB"),
        "24.07-py3",  # DC R535 >= 535.86 (Triton rel-24-07)
        "forward compatibility",
        id="datacenter-forward-compat",
    ),
    pytest.param(
        {},
        make_host("525.85.12", "NVIDIA H100 80GB HBM3"),
        # 23.02 (CUDA 12.0.1, 525.85.11 or later: Triton rel-23-02) runs natively. Newer
        # rows list R525 as a forward-compatibility branch (their NVIDIA_REQUIRE_CUDA), but
        # NVIDIA's CUDA Compatibility guide lists no R525 for any cuda-compat package:
        # unverified, so passed over (issue 22, item 6); --newest takes 25.05.
        "23.02-py3",
        "≥ 525",
        id="h100-on-r525",
    ),
    pytest.param(
        {},
        make_host("580.95.05", "NVIDIA GeForce RTX 5090"),
        "26.09-py3",  # the newest with a recorded PyTorch version
        "≥ 580",
        id="blackwell-new-driver",
    ),
    pytest.param(
        {},
        make_host("580.95.05", "Tesla V100-SXM2-32GB"),
        "24.12-py3",
        "≥ 560",
        id="volta-stops-at-cc-6.0-images",
    ),
    pytest.param(
        {"python": "3.10"}, make_host("580.95.05"), "24.10-py3", "≥ 560", id="python-3.10-last"
    ),
    pytest.param({"cuda": "12.4"}, make_host(None), "24.05-py3", "not checked", id="cuda-series"),
    pytest.param(
        {"version": ">=2.1,<2.3"},
        make_host("535.104.05", "NVIDIA GeForce RTX 3090"),
        "23.10-py3",
        "≥ 535",
        id="range",
    ),
    pytest.param(
        {"version": "2.4"},
        make_host("535.104.05", "Some Server GPU", brand="tesla"),
        "24.07-py3",
        "forward compatibility",
        id="nvml-brand-tesla-is-datacenter",
    ),
]


@pytest.mark.parametrize(("fields", "host", "tag", "route"), CASES)
def test_resolves(matrix: Matrix, fields: dict[str, str], host: Host, tag: str, route: str) -> None:
    resolution = resolve(spec(**fields), matrix, host)
    assert resolution.row.tag == tag
    assert route in (resolution.candidate.driver_route or "")


@pytest.mark.parametrize(
    ("framework", "fields", "image"),
    [
        ("tensorflow", {}, "nvcr.io/nvidia/tensorflow:25.02-tf2-py3"),
        # The newest JAX tag whose JAX version the matrix records (26.07's, the newest
        # tag in use per matrix-audit 3, is not; 26.05's was found for issue 31).
        ("jax", {}, "nvcr.io/nvidia/jax:26.05-py3"),
        ("none", {"cuda": "12.4"}, "nvcr.io/nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04"),
    ],
)
def test_other_frameworks(
    matrix: Matrix, framework: str, fields: dict[str, str], image: str
) -> None:
    assert resolve(spec(framework, **fields), matrix, make_host("580.95.05")).row.image == image


# (spec fields, host, fragments of message + explanation, fragments of the hint)
FAILURES = [
    pytest.param(
        {"version": "2.4"},
        make_host("535.104.05", "NVIDIA GeForce RTX 4090"),
        [
            "needs driver ≥ 545 (this host has 535.104.05)",
            "works on data-center GPUs only",
            "RTX 4090 is a consumer GPU",
        ],
        ["Upgrade the NVIDIA driver to ≥ 545", "PyTorch ≤ 2.1", "23.10-py3"],
        id="issue-example-old-driver-geforce",
    ),
    pytest.param(
        {"version": "2.4"},
        make_host("575.51.03", "NVIDIA GeForce RTX 5090"),
        ["Blackwell (sm_120) needs CUDA ≥ 12.8; this image has CUDA 12.4.1"],
        ["PyTorch ≥ 2.6", "25.01-py3"],
        id="sm120-needs-cuda-12.8",
    ),
    pytest.param(
        {"version": "2.1", "python": "3.12"},
        make_host(None),
        ["no image in the matrix has PyTorch 2.1 with Python 3.12", "has Python 3.10, not 3.12"],
        ["Python ≤ 3.10", "PyTorch ≥ 2.6"],
        id="spec-contradicts-matrix",
    ),
    pytest.param(
        {},
        make_host("470.82.01", "Tesla K80"),
        ["K80 is 3.7 (sm_37)"],
        [],  # nothing gpuenv can change fixes it: no hint rather than one that fixes nothing
        id="kepler",
    ),
    pytest.param(
        {"version": "2.8"},
        make_host("575.51.03", "Tesla V100-SXM2-32GB"),
        ["is built for compute capability ≥ 7.5; Tesla V100-SXM2-32GB is 7.0 (sm_70)"],
        ["PyTorch ≤ 2.6"],
        id="volta-dropped-from-25.01",
    ),
    pytest.param(
        {"cuda": ">=13"},
        make_host("575.51.03", "NVIDIA GeForce RTX 4090"),
        ["needs driver ≥ 580 (this host has 575.51.03)"],
        ["Upgrade the NVIDIA driver to ≥ 580"],
        id="cuda-13-needs-r580",
    ),
    pytest.param(
        {"version": "9.9"},
        make_host(None),
        ["has PyTorch 2.14.0a0+b2c75dd062, not 9.9"],
        ["PyTorch ≤ 2.14"],
        id="unknown-version",
    ),
]


@pytest.mark.parametrize(("fields", "host", "explains", "hints"), FAILURES)
def test_failures_explain(
    matrix: Matrix, fields: dict[str, str], host: Host, explains: list[str], hints: list[str]
) -> None:
    with pytest.raises(ResolutionError) as info:
        resolve(spec(**fields), matrix, host)
    text = "\n".join([info.value.message, *info.value.explanation])
    for fragment in explains:
        assert fragment in text
    for fragment in hints:
        assert fragment in (info.value.hint or "")
    if not hints:
        assert info.value.hint is None
    assert info.value.exit_code == 4


@pytest.mark.parametrize(
    ("cuda", "cc", "expected"),
    [
        ("12.6.3", "9.0", None),
        ("11.4", "8.9", None),  # binary compatible: sm_86 cubins run on sm_89
        ("11.4", "9.0", "Hopper (sm_90) needs CUDA ≥ 11.8"),
        ("12.6.3", "12.0", "needs CUDA ≥ 12.8"),
        ("12.6.3", "10.0", "needs CUDA ≥ 12.8"),
        ("12.8.0", "12.0", None),
        ("13.0.0", "7.0", "CUDA 13.0 dropped sm_70 (Volta)"),
        ("12.9.1", "7.0", None),
        ("13.0.0", "7.5", None),
        ("12.0.1", "3.7", "CUDA 12.0 dropped sm_37"),
    ],
)
def test_cuda_builds_for(matrix: Matrix, cuda: str, cc: str, expected: str | None) -> None:
    why = _cuda_supports(matrix, cuda, ComputeCapability.parse(cc))
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why


def test_selected_gpus_only(matrix: Matrix) -> None:
    host = make_host("580.95.05", "Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-80GB")
    assert resolve(spec(), matrix, host).row.tag == "24.12-py3"
    pinned = spec().with_overrides(gpus=GpuRequest("devices", devices=("1",)))
    assert resolve(pinned, matrix, host).row.tag == "26.09-py3"
    no_gpu = spec().with_overrides(gpus=GpuRequest("none"))
    assert resolve(no_gpu, matrix, host).row.tag == "26.09-py3"


def test_nvml_compute_capability_wins(matrix: Matrix) -> None:
    host = Host(
        DriverVersion.parse("575.51.03"),
        (Gpu(0, "NVIDIA Future GPU", compute_capability=ComputeCapability.parse("12.0")),),
        "test",
    )
    with pytest.raises(ResolutionError, match="no image fits"):
        resolve(spec(version="2.4"), matrix, host)


def test_unknown_gpu_warns(matrix: Matrix) -> None:
    resolution = resolve(spec(), matrix, make_host("580.95.05", "NVIDIA Mystery"))
    assert any("compute capability of NVIDIA Mystery is unknown" in w for w in resolution.warnings)


def test_prefer_keeps_the_locked_image(matrix: Matrix) -> None:
    host = make_host("580.95.05")
    assert (
        resolve(spec(), matrix, host, prefer="nvcr.io/nvidia/pytorch:24.05-py3").row.tag
        == "24.05-py3"
    )
    # A preference that no longer fits is ignored.
    assert (
        resolve(
            spec(version="2.5"), matrix, host, prefer="nvcr.io/nvidia/pytorch:24.05-py3"
        ).row.tag
        == "24.10-py3"
    )


def test_unverified_rows_warn(matrix: Matrix) -> None:
    resolution = resolve(spec(version="2.3"), matrix, make_host("580.95.05"))
    assert resolution.row.tag == "24.04-py3"
    [warning] = [w for w in resolution.warnings if "unverified" in w]
    assert "the framework version" in warning and "check the image's release notes" in warning
    # In the user's words: none of the matrix notes' research tags (issue 11, item 5).
    for tag in ("[S]", "[P]", "(R)", "Table", " era", "Jetson table"):
        assert tag not in warning
    verified = resolve(
        spec(version="2.4", cuda="12.4"), matrix, make_host("550.54.15", "NVIDIA GeForce RTX 4090")
    )
    assert not any("unverified" in w for w in verified.warnings)


def test_forward_compat_warns(matrix: Matrix) -> None:
    resolution = resolve(
        spec(version="2.4"), matrix, make_host("535.104.05", "NVIDIA A100-SXM4-80GB")
    )
    assert any("error 804" in w for w in resolution.warnings)


def test_json_payload(matrix: Matrix) -> None:
    data = resolve(
        spec(version="2.4"), matrix, make_host("550.54.15", "NVIDIA GeForce RTX 4090")
    ).to_data()
    assert data["image"] == "nvcr.io/nvidia/pytorch:24.06-py3"  # 545+ (Triton rel-24-06)
    assert data["framework_version"] == "2.4.0a0+f70bd71a48"
    assert (data["cuda"], data["python"], data["min_driver"]) == ("12.5.0", "3.10", "545")


def _without_versions(matrix: Matrix, framework: str) -> Matrix:
    import dataclasses

    images = tuple(
        dataclasses.replace(r, framework_version=None) if r.framework == framework else r
        for r in matrix.images
    )
    return dataclasses.replace(matrix, images=images)


def test_a_version_pin_no_image_records_is_to_be_dropped(matrix: Matrix) -> None:
    """Issue 11, item 5: the hint names the change that works (not the host)."""
    unversioned = _without_versions(matrix, "jax")
    jax = default_spec(".", "jax").with_overrides(version="0.4.30")
    with pytest.raises(ResolutionError) as refused:
        resolve(jax, unversioned, make_host(None))
    hint = refused.value.hint or ""
    assert "Drop the JAX version pin (version: '0.4.30')" in hint
    assert "on this host as described" not in hint


def test_a_version_no_image_has_names_the_nearest_that_exist(matrix: Matrix) -> None:
    pinned = default_spec(".", "pytorch").with_overrides(version="1.9")
    with pytest.raises(ResolutionError) as refused:
        resolve(pinned, matrix, make_host(None))
    hint = refused.value.hint or ""
    assert (
        "no PyTorch image has PyTorch 1.9; the nearest NVIDIA shipped: 1.11.0 (22.02-py3)" in hint
    )


def test_a_tensorflow_newer_than_nvidia_shipped_says_where_the_container_ended(
    matrix: Matrix,
) -> None:
    """ngc-tensorflow.yaml's notice (no TF container after 25.02 is known; Triton PR #8068
    deprecated the TF backend as of 25.03)."""
    newer = default_spec(".", "tensorflow").with_overrides(version="2.18")
    with pytest.raises(ResolutionError) as refused:
        resolve(newer, matrix, make_host(None))
    assert any(
        "last known TensorFlow container is 25.02" in line for line in refused.value.explanation
    )
    assert "2.17.0 (25.02-tf2-py3)" in (refused.value.hint or "")
    assert matrix.notice("tensorflow") and matrix.notice("pytorch") is None


@pytest.mark.parametrize(
    ("framework", "pin", "tag", "source"),
    [
        ("tensorflow", "2.15", "24.05-tf2-py3", "Jetson wheel 2.15.0+nv24.05 (unverified)"),
        ("jax", "0.4.26", "24.04-py3", "image metadata of jax:24.04"),
    ],
)
def test_framework_pins_resolve_where_nvidia_shipped_them(
    matrix: Matrix, framework: str, pin: str, tag: str, source: str
) -> None:
    """Issue 11: a TensorFlow or JAX pin resolves to the image that ships it."""
    pinned = default_spec(".", framework).with_overrides(version=pin)
    chosen = resolve(pinned, matrix, make_host("550.54.15", "NVIDIA H100 80GB HBM3"))
    assert chosen.row.tag == tag, source


def test_an_unrecorded_framework_version_is_named_not_chosen(matrix: Matrix) -> None:
    """Issue 22, item 3: the newest image whose framework version the matrix records is
    chosen; newer ones are named; --newest takes them, and says the version is unknown."""
    host = make_host("580.95.05", "NVIDIA GeForce RTX 5090")
    chosen = resolve(spec(), matrix, host)
    assert chosen.row.tag == "26.09-py3" and chosen.row.framework_version
    assert any(
        "their PyTorch version is not recorded in the matrix (26.10-py3)" in w
        and "`gpuenv matrix sync pytorch` reads it" in w
        for w in chosen.warnings
    )
    newest = resolve(spec(), matrix, host, newest=True)
    assert newest.row.tag == "26.10-py3" and newest.row.framework_version is None
    assert any(
        "PyTorch version of nvcr.io/nvidia/pytorch:26.10-py3 is not recorded" in w
        for w in newest.warnings
    )
