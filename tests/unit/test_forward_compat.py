"""Forward compatibility only where NVIDIA supports it (issue 22, item 6).

Each case names the NVIDIA source of its expected value. [guide]: the CUDA Compatibility
guide's Forward Compatibility table (r615 edition); [drv615]: the data-center drivers'
"Supported Drivers and CUDA Toolkit Versions" (615 edition); [eol]: endoflife.date's
branch types from NVIDIA's releases.json (secondary); the image's own list is the row's
`forward_compat` in matrices/ngc-pytorch.yaml (its NVIDIA_REQUIRE_CUDA branches or NGC
notes). All values are read from matrices/driver-branches.yaml."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from gpuenv.common.versions import DriverVersion
from gpuenv.errors import MatrixError
from gpuenv.host.machine import Gpu, Host
from gpuenv.matrix.load import Matrix, load_matrix
from gpuenv.project.spec import default_spec
from gpuenv.resolution.resolve import FORWARD, classify_gpus, evaluate
from gpuenv.resolution.verdicts import Candidate

MATRICES = Path(__file__).resolve().parents[2] / "matrices"


def _judge(matrix: Matrix, tag: str, driver: str, gpu: str) -> Candidate:
    """The verdict on one NGC PyTorch image for a host of one GPU model."""
    row = next(r for r in matrix.images_for("pytorch") if r.tag == tag)
    host = Host(DriverVersion.parse(driver), (Gpu(0, gpu, uuid="GPU-0"),), "test")
    spec = default_spec("/tmp/p", "pytorch")
    (candidate,) = evaluate(spec, matrix, host, classify_gpus(host, matrix), [row])
    return candidate


@pytest.mark.parametrize(
    ("tag", "driver", "gpu", "verified", "says"),
    [
        # 24.07 = CUDA 12.5.1, minimum 555. [guide] cuda-compat-12-5: C on 535; [drv615]
        # R535 is a Long Term Support Branch; the image lists 535.86.
        ("24.07-py3", "535.104.05", "H100", True, "on R535 ≥ 535.86"),
        # 25.10 = CUDA 13.0.2: the image lists R550 (nvidia/cuda 13.0.2's
        # NVIDIA_REQUIRE_CUDA), [guide] cuda-compat-13-0 lists only 535 and 570.
        ("25.10-py3", "550.163.01", "H100", False, "does not list it for cuda-compat-13-0"),
        # 24.10 = CUDA 12.6.2: the image (NGC notes) lists 470.57, [guide] cuda-compat-12-6
        # lists only 535.
        ("24.10-py3", "470.256.02", "A100", False, "(it lists R535)"),
        # the same for R525, which also ended (December 2023 [eol]) before 24.10
        ("24.10-py3", "525.147.05", "H100", False, "ended in December 2023 by secondary"),
        # 26.06 = CUDA 13.3.0: the image's list is not known ([]), [guide]
        # cuda-compat-13-3 lists R535 (whose end, June 2026 [drv615], is not before 26.06)
        ("26.06-py3", "535.288.01", "H100", False, "is empty (not known)"),
        # 25.06 = CUDA 12.9.1 lists R560; [guide] cuda-compat-12-9: 535 and 570 only;
        # the lifecycle sources disagree on R560's designation ([eol] PB, Azure NFB)
        ("25.06-py3", "560.35.03", "H100", False, "R560's designation is not recorded"),
    ],
)
def test_forward_routes(
    matrix: Matrix, tag: str, driver: str, gpu: str, verified: bool, says: str
) -> None:
    candidate = _judge(matrix, tag, driver, gpu)
    assert candidate.ok, candidate.rejections
    assert candidate.mode == FORWARD
    assert candidate.route_verified is verified
    route = str(candidate.driver_route)
    assert says in route
    assert ("unverified" in route) is not verified


@pytest.mark.parametrize(
    ("tag", "driver", "gpu", "says"),
    [
        # R545 is a new-feature branch ([eol]); [guide]: "New Feature Branches are not
        # supported targets"; for CUDA 12.5 it lists R535, a long-term branch [drv615]
        ("24.07-py3", "545.23.08", "H100", "R545 is a new-feature branch"),
        ("24.07-py3", "545.23.08", "H100", "(R535 for CUDA 12.5)"),
        # R535 ended June 2026 [drv615], before 26.07 (CUDA 13.3.1), though [guide]
        # cuda-compat-13-3 still marks it C ("end of life ... not supported targets")
        ("26.07-py3", "535.288.01", "H100", "reached its end of life in June 2026"),
        ("26.07-py3", "535.288.01", "H100", "table still marks R535 for cuda-compat-13-3"),
        # below the image's own minimum on its branch: Triton rel-24-01 lists R535 from
        # 535.86 on, so 535.54 is refused whatever the guide says of R535
        ("24.01-py3", "535.54.03", "H100", "on R535 its forward compatibility needs ≥ 535.86"),
        # a consumer GPU never runs forward compatibility ([guide]: data-center GPUs)
        ("24.07-py3", "535.104.05", "RTX 4090", "works on data-center GPUs only"),
        # a production branch neither source lists: the image's branches are named
        ("24.07-py3", "515.105.01", "A100", "data-center GPUs also run it on R470 ≥ 470.57"),
    ],
)
def test_forward_refusals(matrix: Matrix, tag: str, driver: str, gpu: str, says: str) -> None:
    candidate = _judge(matrix, tag, driver, gpu)
    assert not candidate.ok
    reasons = " ".join(r.reason for r in candidate.rejections)
    assert says in reasons, reasons


def test_a_branch_the_lifecycle_does_not_know_is_never_a_plain_route(matrix: Matrix) -> None:
    """R535 with CUDA 12.5 is verified with the lifecycle table, unverified without it."""
    bare = dataclasses.replace(matrix, branches=())
    candidate = _judge(bare, "24.07-py3", "535.104.05", "H100")
    assert candidate.ok and candidate.mode == FORWARD
    assert not candidate.route_verified
    assert "R535's designation is not recorded" in str(candidate.driver_route)


def test_a_cuda_minor_the_guide_has_no_row_for_is_unverified(matrix: Matrix) -> None:
    """23.05 = CUDA 12.1.1: the r615 guide has no cuda-compat-12-1 row."""
    candidate = _judge(matrix, "23.05-py3", "525.147.05", "A100")
    assert candidate.ok and not candidate.route_verified
    assert "has no row for cuda-compat-12-1" in str(candidate.driver_route)


def test_the_shipped_table_is_read(matrix: Matrix) -> None:
    """Spot values of matrices/driver-branches.yaml, each from its NVIDIA source."""
    r535, r545, r610 = (matrix.driver_branch(b) for b in (535, 545, 610))
    assert r535 and (r535.designation, r535.end_of_life) == ("long-term", "2026-06")  # drv615
    assert r545 and r545.designation == "new-feature"  # eol
    assert r610 and (r610.designation, r610.end_of_life) == ("new-feature", "2026-08")  # drv615
    support = matrix.forward_support_for("13.0.2")
    assert support and support.branches == ("535", "570")  # guide
    assert matrix.forward_support_for("12.1.1") is None  # guide: no cuda-compat-12-1 row


def _broken(tmp_path: Path, old: str, new: str) -> str:
    folder = tmp_path / "m"
    shutil.copytree(MATRICES, folder)
    path = folder / "driver-branches.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(MatrixError) as info:
        load_matrix(str(folder), with_overlay=False)
    return str(info.value)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'branch: "418", designation: long-term',
            'branch: "418", designation: lts',
            "'lts' is not one of long-term, production, new-feature, evaluation",
        ),
        ('branch: "418"', 'branch: "R418"', "'R418' is not a driver branch"),
        ('end_of_life: "2022-03"', 'end_of_life: "March 2022"', "is not a month (YYYY-MM)"),
        ('branch: "440"', 'branch: "418"', "branch R418 is listed twice"),
        ('cuda: "12.3"', 'cuda: "12.3.2"', "'12.3.2' is not a CUDA minor (X.Y)"),
        ('branches: ["535"], evidence', 'branches: ["53x"], evidence', "'53x' is not a driver"),
        ("forward_compat_support:", "forward_support:", "expected a non-empty list"),
    ],
)
def test_loader_locates_problems(tmp_path: Path, old: str, new: str, message: str) -> None:
    text = _broken(tmp_path, old, new)
    assert "driver-branches.yaml:" in text
    assert message in text
