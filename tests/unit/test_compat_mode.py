"""Every verdict names its compatibility mode (issue 22, item 7), under one policy for
CUDA 12.x and 13.x: an image's minimum is NVIDIA's stated one raised to its major's
minor-version floor; at or above the toolkit's own driver it runs natively, below it by
CUDA minor-version compatibility, which --strict-driver / `strict_driver: true` refuse;
data-center GPUs below it may run by forward compatibility. The drivers are the
matrix's: cuda.yaml (CUDA 13.4 GA: R615; 13.0.1: 580.82.07; 12.4.1: 550.54.15) and the
rows of ngc-pytorch.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuenv.cli.tree import main
from tests.unit.fake_engine import lock_packages


def resolve(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(main, ["resolve", "--json", "--framework", "pytorch", *args])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(
    ("args", "image", "mode"),
    [
        # 26.09 (CUDA 13.4.1, minimum 580) on 580.82.07: below CUDA 13.4's own R615
        (
            ("--driver", "580.82.07", "--gpu", "RTX 4090"),
            "nvcr.io/nvidia/pytorch:26.09-py3",
            "minor-version compatibility",
        ),
        # the same host, native only: 25.09 (CUDA 13.0.1, whose own driver is 580.82.07)
        (
            ("--driver", "580.82.07", "--gpu", "RTX 4090", "--strict-driver"),
            "nvcr.io/nvidia/pytorch:25.09-py3",
            "native",
        ),
        # 24.04 (CUDA 12.4.1) on its toolkit's own driver
        (
            ("--driver", "550.54.15", "--gpu", "H100", "--version", "2.3"),
            "nvcr.io/nvidia/pytorch:24.04-py3",
            "native",
        ),
        # a data-center GPU on R535, below 24.07's minimum (R535 listed for forward compat)
        (
            ("--driver", "535.104.05", "--gpu", "H100", "--version", "2.4"),
            "nvcr.io/nvidia/pytorch:24.07-py3",
            "forward compatibility",
        ),
    ],
)
def test_each_verdict_names_its_mode(args: tuple[str, ...], image: str, mode: str) -> None:
    data = resolve(*args)
    assert data["image"] == image
    assert data["compatibility_mode"] == mode
    route = str(data["driver_route"])
    assert mode.split()[0] in route or (mode == "native" and route.endswith(", native"))


def test_no_driver_no_mode(tmp_path: Path) -> None:
    host = tmp_path / "host.json"
    host.write_text("{}")
    result = CliRunner().invoke(
        main,
        ["resolve", "--json", "--framework", "pytorch", "--version", "2.4"],
        env={"GPUENV_HOST_FILE": str(host)},
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["compatibility_mode"] is None


def test_the_spec_field_asks_for_native_and_the_lock_records_the_mode(tmp_path: Path) -> None:
    (tmp_path / "gpuenv.yaml").write_text("name: p\nframework: pytorch\nstrict_driver: true\n")
    locked = CliRunner().invoke(
        main, ["-C", str(tmp_path), "lock", "--driver", "580.82.07", "--gpu", "RTX 4090"]
    )
    assert locked.exit_code == 0, locked.output
    lock = (tmp_path / "gpuenv.lock").read_text()
    assert "reference: nvcr.io/nvidia/pytorch:25.09-py3" in lock
    assert "compatibility: native" in lock


def test_a_strict_driver_that_is_not_true_or_false_is_a_spec_error(tmp_path: Path) -> None:
    (tmp_path / "gpuenv.yaml").write_text(
        "name: p\nframework: pytorch\nstrict_driver: yes please\n"
    )
    result = CliRunner().invoke(main, ["-C", str(tmp_path), "check"])
    assert result.exit_code == 3, result.output
    assert "field 'strict_driver'" in result.stderr or "strict_driver" in result.stderr


@pytest.mark.parametrize(
    ("flags", "image", "written"),
    [
        # 550.54.15 is CUDA 12.4's own driver (CUDA 12.4 Update 1 release notes): 24.05
        # (CUDA 12.4.1) runs natively; 24.06 (CUDA 12.5) only by minor-version compatibility.
        ((), "pytorch:24.06-py3", "# strict_driver: true"),
        (("--strict-driver",), "pytorch:24.05-py3", "\nstrict_driver: true"),
    ],
)
def test_init_writes_strict_driver_and_locks_by_it(
    tmp_path: Path, flags: tuple[str, ...], image: str, written: str
) -> None:
    (tmp_path / "requirements.txt").write_text("torch\n")
    args = ["-C", str(tmp_path), "init", *flags, "--driver", "550.54.15", "--gpu", "H100"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert written in (tmp_path / "gpuenv.yaml").read_text()
    assert f"nvcr.io/nvidia/{image}" in (tmp_path / "gpuenv.lock").read_text()
    lock_packages(str(tmp_path))
    assert CliRunner().invoke(main, ["-C", str(tmp_path), "lock", "--check"]).exit_code == 0


def test_init_newest_takes_what_resolution_passes_over(tmp_path: Path) -> None:
    """An H100 on R550: 26.02 fits only by a forward compatibility NVIDIA's documents
    disagree on (the image lists R550; the CUDA Compatibility guide does not for 13.1)."""
    (tmp_path / "requirements.txt").write_text("torch\n")
    args = ["-C", str(tmp_path), "init", "--newest", "--driver", "550.54.15", "--gpu", "H100"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    lock = (tmp_path / "gpuenv.lock").read_text()
    assert "nvcr.io/nvidia/pytorch:26.02-py3" in lock and "route_verified: false" in lock
