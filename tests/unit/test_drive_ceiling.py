"""Drivers that cannot drive a GPU because their branch came after the last one for its
architecture (issue 22, item 5). The branches are matrices/cuda.yaml's, each from
NVIDIA: R470 for Kepler ("Current graphics driver releases": 470.xx is the legacy branch
for GKxxx Kepler GPUs), R580 for Maxwell, Pascal and Volta (Unix graphics feature
deprecation schedule: "the 580 series will be the last to support" them)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main
from gpuenv.common.versions import ComputeCapability
from gpuenv.matrix.load import load_matrix


@pytest.mark.parametrize(
    ("cc", "branch"),
    [
        ("3.5", 470),
        ("3.7", 470),
        ("5.0", 580),
        ("5.2", 580),
        ("6.0", 580),
        ("6.1", 580),
        ("7.0", 580),
    ],
)
def test_the_matrix_records_each_architectures_last_branch(cc: str, branch: int) -> None:
    ceiling = load_matrix().drive_ceiling(ComputeCapability.parse(cc))
    assert ceiling is not None and ceiling.branch == branch


@pytest.mark.parametrize("cc", ["7.5", "8.0", "8.9", "9.0", "10.0", "12.0"])
def test_newer_architectures_have_no_last_branch(cc: str) -> None:
    assert load_matrix().drive_ceiling(cc) is None


def resolve(driver: str, gpu: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, ["resolve", "--framework", "pytorch", "--driver", driver, "--gpu", gpu]
    )
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(
    ("driver", "gpu", "said"),
    [
        ("595.45.04", "Tesla V100-SXM2-32GB", "R580 is the last branch that drives it"),
        ("590.44.01", "Tesla P100-PCIE-16GB", "R580 is the last branch that drives it"),
        ("535.104.05", "Tesla K80", "R470 is the last branch that drives it"),
    ],
)
def test_a_branch_after_the_last_is_refused_with_the_branch_to_stay_on(
    driver: str, gpu: str, said: str
) -> None:
    code, output = resolve(driver, gpu)
    assert code == 4, output
    assert "cannot drive the" in output and said in output
    branch = said.split()[0]
    assert f"stay on {branch} (its latest release)" in output


@pytest.mark.parametrize(
    ("driver", "gpu"),
    [("580.82.07", "Tesla V100-SXM2-32GB"), ("470.256.02", "Tesla K80"), ("595.45.04", "H100")],
)
def test_the_last_branch_itself_still_drives(driver: str, gpu: str) -> None:
    code, output = resolve(driver, gpu)
    assert "cannot drive" not in output, output
    assert code in (0, 4)


@pytest.mark.parametrize(
    ("platform", "said"), [("linux/arm64", True), ("linux/amd64", False), (None, False)]
)
def test_an_unrecorded_platform_is_said_not_checked(platform: str | None, said: bool) -> None:
    """A shipped row that does not record its platforms (matrix sync reads them): an arm64 host
    is told the platform was not checked, never silence; every NGC image is amd64."""
    args = ["resolve", "--framework", "pytorch", "--driver", "580.82.07", "--gpu", "H100"]
    result = CliRunner().invoke(main, [*args, *(["--platform", platform] if platform else [])])
    assert result.exit_code == 0, result.output
    assert ("platform not checked" in result.output) is said
    if said:
        assert f"this host is {platform}" in " ".join(result.output.split())
