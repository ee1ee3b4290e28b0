"""Any base image, checked the same way (issue 31, item 2): Docker Hub's official images
as a matrix family, and a base of the team's own read from the image itself."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv.app.own_base import own_base_notes, with_own_base
from gpuenv.common.versions import ComputeCapability, DriverVersion
from gpuenv.errors import EngineError, ResolutionError, SpecError
from gpuenv.host.machine import Gpu, Host
from gpuenv.lock.lockfile import (
    LOCK_FILENAME,
    lock_from_resolution,
    locked_row_problems,
    own_row_from_lock,
    read_lock,
    write_lock,
)
from gpuenv.matrix.load import load_matrix
from gpuenv.matrix.own import (
    combined,
    from_config,
    from_probe,
    own_row,
    probe_answer,
    unknowns,
)
from gpuenv.project.validate import load_spec
from gpuenv.resolution.resolve import resolve

MATRIX = load_matrix(with_overlay=False)
OWN = "registry.example.com/team/train:2025.03"
NVIDIA_ENV = [
    "PATH=/usr/local/nvidia/bin:/usr/bin",
    "CUDA_VERSION=12.4.1",
    "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471 "
    "brand=tesla,driver>=535,driver<536",
    "PYTHON_VERSION=3.11.9",
]
TORCH_PROBE = {
    "python": "3.11.9",
    "framework": "2.5.1+cu124",
    "cuda": "12.4",
    "cudnn": 90100,
    "arch": "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90",
}


def host(driver: str, gpu: str = "NVIDIA A100-SXM4-80GB", cc: str = "8.0") -> Host:
    return Host(
        DriverVersion.parse(driver),
        (Gpu(0, gpu, compute_capability=ComputeCapability.parse(cc)),),
        "test",
    )


def spec_in(tmp_path: Path, text: str):
    (tmp_path / "gpuenv.yaml").write_text(text)
    return load_spec(str(tmp_path))


# --- gpuenv.yaml's base -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "problem"),
    [
        ("ngc", None),
        ("dockerhub", None),
        (OWN, None),
        ("127.0.0.1:5000/team/train:1@sha256:" + "a" * 64, None),
        ("ubuntu:22.04", None),
        ("dockerhb", "did you mean 'dockerhub'"),
        ("registry.example.com/team/train", "names no tag"),
        ("Team/Train:1", "is not an image reference"),
        ("team/train:$(id)", "is not an image reference"),
    ],
)
def test_base_takes_a_family_or_an_image_reference(
    tmp_path: Path, base: str, problem: str | None
) -> None:
    text = f"framework: pytorch\nbase: '{base}'\n"
    if problem is None:
        assert spec_in(tmp_path, text).base == base
        return
    with pytest.raises(SpecError) as caught:
        spec_in(tmp_path, text)
    assert caught.value.exit_code == 3
    assert problem in str(caught.value.problems[0]), caught.value.problems


# --- Docker Hub's official images -------------------------------------------------------


def test_dockerhub_rows_carry_their_sources() -> None:
    for framework in ("pytorch", "tensorflow"):
        rows = MATRIX.images_for(framework, "dockerhub")
        assert rows, framework
        for row in rows:
            assert row.repository.startswith("docker.io/")
            assert row.framework_version and row.cuda, row.image
            assert row.evidence == "secondary" and "https://github.com/" in row.note, row.image


def test_tensorflow_after_nvidias_last_container_resolves_on_docker_hub(tmp_path: Path) -> None:
    spec = spec_in(tmp_path, "framework: tensorflow\nversion: '2.18'\nbase: dockerhub\n")
    resolution = resolve(spec, MATRIX, host("570.86.15"))
    assert resolution.row.image == "docker.io/tensorflow/tensorflow:2.18.0-gpu"
    assert resolution.candidate.mode == "native"
    said = " ".join(resolution.warnings)
    assert "tensorflow[and-cuda]==2.18.0" in said and "cuDNN 8.9" in said


def test_tensorflow_on_docker_hub_needs_the_driver_its_cuda_base_requires(tmp_path: Path) -> None:
    spec = spec_in(tmp_path, "framework: tensorflow\nversion: '2.19'\nbase: dockerhub\n")
    with pytest.raises(ResolutionError) as caught:
        resolve(spec, MATRIX, host("535.104.05", "NVIDIA GeForce RTX 4090", "8.9"))
    assert "needs driver ≥ 545.23.06" in str(caught.value.explanation)


def test_a_version_ngc_lacks_points_to_docker_hub(tmp_path: Path) -> None:
    spec = spec_in(tmp_path, "framework: tensorflow\nversion: '2.20'\n")
    with pytest.raises(ResolutionError) as caught:
        resolve(spec, MATRIX, host("570.86.15"))
    assert "`base: dockerhub`" in (caught.value.hint or "")
    assert "tensorflow/tensorflow:2.20.0-gpu" in (caught.value.hint or "")


def test_pytorch_wheels_run_by_minor_version_compatibility(tmp_path: Path) -> None:
    spec = spec_in(tmp_path, "framework: pytorch\nbase: dockerhub\n")
    resolution = resolve(spec, MATRIX, host("550.54.15"))
    assert resolution.row.framework_version == "2.14.0"
    assert resolution.row.tag.endswith("-runtime")  # the smaller twin first
    assert resolution.candidate.mode == "minor-version compatibility"


# --- a base of the team's own -----------------------------------------------------------


def test_config_reading_takes_nvidias_environment() -> None:
    reading = from_config("pytorch", {"Env": NVIDIA_ENV, "Labels": {}})
    assert reading.values == {"cuda": "12.4.1", "python": "3.11.9"}
    assert reading.forward_compat == ("470", "535")
    assert "CUDA_VERSION" in reading.sources["cuda"]


def test_probe_reading_takes_what_the_framework_says() -> None:
    answer = probe_answer("noise\nGPUENV-PROBE " + __import__("json").dumps(TORCH_PROBE) + "\n")
    reading = from_probe("pytorch", answer)
    assert reading.values == {
        "python": "3.11.9",
        "framework_version": "2.5.1+cu124",
        "cuda": "12.4",
        "cudnn": "9.1.0",
        "min_compute_capability": "5.0",
    }
    assert probe_answer("no marker here") is None
    assert from_probe("pytorch", {"python": "3.10.4", "error": "ModuleNotFoundError: torch"}).said


def test_the_config_wins_and_a_disagreement_is_said() -> None:
    config = from_config("pytorch", {"Env": NVIDIA_ENV})
    probe = from_probe("pytorch", {**TORCH_PROBE, "cuda": "12.1"})
    reading = combined(config, probe)
    assert reading.values["cuda"] == "12.4.1"
    assert "says 12.4.1" in reading.said and "12.1" in reading.said
    agree = combined(config, from_probe("pytorch", TORCH_PROBE))
    assert agree.said == ""  # 12.4 and 12.4.1 are the same CUDA


def test_own_row_is_checked_like_a_matrix_row(tmp_path: Path) -> None:
    reading = combined(
        from_config("pytorch", {"Env": NVIDIA_ENV}), from_probe("pytorch", TORCH_PROBE)
    )
    row = own_row("pytorch", OWN, reading, MATRIX.toolkit_driver)
    assert (row.repository, row.tag, row.family) == (
        "registry.example.com/team/train",
        "2025.03",
        OWN,
    )
    assert str(row.min_driver) == "550.54.15" and row.evidence == "image"
    assert unknowns(row) == []
    spec = spec_in(tmp_path, f"framework: pytorch\nbase: '{OWN}'\nversion: '2.5'\n")
    matrix = replace(MATRIX, images=(row, *MATRIX.images))
    assert resolve(spec, matrix, host("550.54.15")).row is row
    with pytest.raises(ResolutionError) as caught:
        resolve(spec, matrix, host("535.104.05", "NVIDIA GeForce RTX 4090", "8.9"))
    assert "needs driver ≥ 550.54.15" in str(caught.value.explanation)
    wrong = spec_in(tmp_path, f"framework: pytorch\nbase: '{OWN}'\nversion: '2.4'\n")
    with pytest.raises(ResolutionError):
        resolve(wrong, matrix, host("550.54.15"))


def test_what_the_image_does_not_say_is_said(tmp_path: Path) -> None:
    row = own_row(
        "pytorch", OWN, from_config("pytorch", {"Env": ["PATH=/usr/bin"]}), MATRIX.toolkit_driver
    )
    spec = spec_in(tmp_path, f"framework: pytorch\nbase: '{OWN}'\n")
    notes = own_base_notes(row, spec)
    assert len(notes) == 1
    for what in ("CUDA version", "framework version", "Python version", "GPU architectures"):
        assert what in notes[0]
    for fix in ("ENV CUDA_VERSION=", "a torch that python3 imports", "ENV CUDA_ARCH_LIST="):
        assert fix in notes[0]
    assert "not stated by the image" in row.note


def test_the_lock_keeps_the_row_it_read(tmp_path: Path) -> None:
    reading = combined(
        from_config("pytorch", {"Env": NVIDIA_ENV}), from_probe("pytorch", TORCH_PROBE)
    )
    row = own_row("pytorch", OWN, reading, MATRIX.toolkit_driver)
    spec = spec_in(tmp_path, f"framework: pytorch\nbase: '{OWN}'\n")
    calls = []

    def read(spec_, matrix_):
        calls.append(spec_.base)
        return row, "sha256:" + "b" * 64

    based = with_own_base(spec, MATRIX, read)
    assert based.digest == "sha256:" + "b" * 64 and calls == [OWN]
    resolution = resolve(spec, based.matrix, host("550.54.15"))
    path = tmp_path / LOCK_FILENAME
    write_lock(str(path), lock_from_resolution(resolution, MATRIX.version, based.digest))
    lock = read_lock(str(path))
    assert lock.pinned_image == "registry.example.com/team/train@sha256:" + "b" * 64
    again = own_row_from_lock(lock, OWN)
    assert again is not None
    for field in ("framework_version", "cuda", "python", "min_driver", "forward_compat"):
        assert getattr(again, field) == getattr(row, field), field
    assert locked_row_problems(lock, spec, MATRIX) == []
    # A re-lock reads nothing: the lock's row is used.
    assert with_own_base(spec, MATRIX, None, lock).matrix.images[0].cuda == "12.4.1"
    # Another base is not the locked one.
    other = spec_in(tmp_path, "framework: pytorch\nbase: 'registry.example.com/team/x:1'\n")
    assert "not the image" in locked_row_problems(lock, other, MATRIX)[0]
    with pytest.raises(EngineError):
        with_own_base(other, MATRIX, None, lock)
