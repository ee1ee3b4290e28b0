"""Platform data of the shipped rows (issue 22, item 9): rows a source covers carry their
platforms, an arm64 host gets a multi-arch image or a reason, and a row nobody covered
still says "platform not checked", never silence."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from gpuenv.app.platforms import check_platform
from gpuenv.cli.tree import main
from gpuenv.common.versions import DriverVersion
from gpuenv.errors import ResolutionError
from gpuenv.host.machine import Gpu, Host
from gpuenv.matrix.load import ImageRow, Matrix, load_matrix
from gpuenv.project.spec import default_spec
from gpuenv.resolution.resolve import resolve
from tests.unit.fake_engine import FakeEngine

BOTH = ["linux/amd64", "linux/arm64"]
# NVIDIA's DGX Spark/Station playbooks (github.com/NVIDIA/dgx-spark-playbooks @0db7c141) run
# these tags on ARM64 machines; the file is the one each row's note names.
PLAYBOOKS = "NVIDIA/dgx-spark-playbooks"
H100 = (Gpu(0, "NVIDIA H100 80GB HBM3"),)


@pytest.fixture(scope="module")
def shipped() -> Matrix:
    return load_matrix()


def _row(matrix: Matrix, image: str) -> ImageRow:
    rows = [row for row in matrix.images if row.image == image]
    assert rows, f"no row for {image}"
    return rows[0]


@pytest.mark.parametrize(
    ("image", "platforms", "extrapolated", "source"),
    [
        ("nvcr.io/nvidia/pytorch:25.08-py3", BOTH, False, f"{PLAYBOOKS} portfolio-optimization"),
        ("nvcr.io/nvidia/pytorch:25.09-py3", BOTH, False, f"{PLAYBOOKS} flux-finetuning"),
        ("nvcr.io/nvidia/pytorch:25.10-py3", BOTH, False, f"{PLAYBOOKS} pytorch-fine-tune"),
        ("nvcr.io/nvidia/pytorch:25.11-py3", BOTH, False, f"{PLAYBOOKS} unsloth"),
        ("nvcr.io/nvidia/pytorch:25.12-py3", BOTH, False, f"{PLAYBOOKS} connect-two-sparks"),
        ("nvcr.io/nvidia/pytorch:26.01-py3", BOTH, False, f"{PLAYBOOKS} station-kernel-dev-ft"),
        ("nvcr.io/nvidia/pytorch:26.02-py3", BOTH, False, f"{PLAYBOOKS} station-comfyui"),
        ("nvcr.io/nvidia/pytorch:26.03-py3", BOTH, True, "between 26.02 and 26.04"),
        ("nvcr.io/nvidia/pytorch:26.04-py3", BOTH, False, f"{PLAYBOOKS} station-nanochat"),
        # No source found for these: left out, so an arm64 host is told it was not checked.
        ("nvcr.io/nvidia/pytorch:25.06-py3", [], False, "none found"),
        ("nvcr.io/nvidia/pytorch:26.05-py3", [], False, "none found"),
        ("nvcr.io/nvidia/pytorch:24.08-py3", [], False, "third-party Dockerfiles only"),
        ("nvcr.io/nvidia/tensorflow:25.02-tf2-py3", [], False, "none found"),
        ("nvcr.io/nvidia/jax:25.10-py3", [], False, "the jax playbook uses nvidia/cuda"),
    ],
)
def test_shipped_platforms(
    shipped: Matrix, image: str, platforms: list[str], extrapolated: bool, source: str
) -> None:
    row = _row(shipped, image)
    assert list(row.platforms) == platforms, source
    assert ("platforms" in row.unverified) is extrapolated, source
    if platforms:
        assert "platforms:" in row.note, "the note names the platform source"


def test_every_row_with_platforms_names_its_source(shipped: Matrix) -> None:
    listed = [row for row in shipped.images if row.platforms]
    assert listed, "some shipped rows carry platforms"
    for row in listed:
        assert "platforms:" in row.note, row.image
        assert "dgx-spark-playbooks" in row.note, row.image


def _resolve(version: str, platform: str) -> str:
    args = ["resolve", "--framework", "pytorch", "--version", version]
    args += ["--driver", "580.82.07", "--gpu", "H100", "--platform", platform]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_an_arm64_host_gets_a_multi_arch_image_without_a_caveat() -> None:
    """PyTorch 2.9 is 25.09 and 25.10, both recorded as multi-arch."""
    output = _resolve("2.9", "linux/arm64")
    assert "25.10-py3" in output
    assert "platform not checked" not in output


def test_a_row_without_data_still_says_not_checked() -> None:
    """PyTorch 2.5 rows (24.xx) carry no platforms: the arm64 host is told, never silence."""
    output = _resolve("2.5", "linux/arm64")
    assert "platform not checked" in output
    assert "this host is linux/arm64" in output
    assert "platform not checked" not in _resolve("2.5", "linux/amd64")


def test_an_amd64_only_row_is_rejected_on_arm64(shipped: Matrix) -> None:
    """No shipped row is known to be amd64-only; one so recorded (as `matrix sync` would)
    is rejected by the resolver and refused before a run ("exec format error")."""
    row = _row(shipped, "nvcr.io/nvidia/pytorch:25.10-py3")
    only = dataclasses.replace(row, platforms=("linux/amd64",))
    matrix = dataclasses.replace(shipped, images=(only,))
    host = Host(DriverVersion.parse("580.82.07"), H100, "test", platform="linux/arm64")
    with pytest.raises(ResolutionError) as refused:
        resolve(default_spec(".", "pytorch"), matrix, host)
    assert "is built for linux/amd64; this host is linux/arm64" in "\n".join(
        refused.value.explanation
    )
    fits = resolve(default_spec(".", "pytorch"), dataclasses.replace(shipped, images=(row,)), host)
    assert fits.row.image == row.image


class _RemoteArm(FakeEngine):
    endpoint = "tcp://gh200.example:2376"

    def info(self) -> dict[str, object]:
        return {"Architecture": "aarch64", "OSType": "linux"}


def test_the_engine_check_uses_the_shipped_platforms(shipped: Matrix) -> None:
    engine = _RemoteArm()
    multi = _row(shipped, "nvcr.io/nvidia/pytorch:25.10-py3")
    check_platform(multi.image, multi.platforms, engine)  # type: ignore[arg-type]
    with pytest.raises(ResolutionError) as refused:
        check_platform(multi.image, ["linux/amd64"], engine)  # type: ignore[arg-type]
    assert "exec format error" in " ".join(refused.value.explanation)


@pytest.mark.parametrize("platform", ["linux/arm64", "linux/amd64"])
def test_an_extrapolated_platform_list_is_said_to_be_unverified(platform: str) -> None:
    """26.03 (PyTorch 2.11) sits between sourced months: its platforms are extrapolated,
    so a host whose platform the check used is told they are unverified; a host of no
    known platform did not rely on them and is not."""
    output = _resolve("2.11", platform)
    assert "26.03-py3" in output
    assert "the platforms it is built for is unverified" in output
    args = ["resolve", "--framework", "pytorch", "--version", "2.11"]
    unknown = CliRunner().invoke(main, [*args, "--driver", "580.82.07", "--gpu", "H100"])
    assert "platforms it is built for" not in " ".join(unknown.output.split())
