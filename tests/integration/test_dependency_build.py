"""Builds on the dependency stand-in (scripts/services.sh DEPS_STANDIN_TAGS): an image that,
like NGC PyTorch >= 25.03, carries NVIDIA-built torch 2.7.0a0+7c8ec84dab and torchvision
0.22.0a0+standin and pins them (and numpy) in /etc/pip/constraint.txt via PIP_CONSTRAINT."""

from __future__ import annotations

import os

import pytest

from .conftest import docker

pytestmark = pytest.mark.integration
HOST = ["--driver", "570.86.10", "--gpu", "RTX 4090"]
TAG = "25.03-py3"


@pytest.fixture
def on_standin(make_project):
    tags = os.environ.get("GPUENV_TEST_DEPS_STANDIN_TAGS", "").split()
    if TAG not in tags:
        pytest.fail(
            "no dependency stand-in in the registry: run `sudo scripts/services.sh up`",
            pytrace=False,
        )

    def make(requirements: str):
        project = make_project()
        project.write("requirements.txt", requirements)
        project.write(
            "gpuenv.yaml",
            f"name: {project.name}\nframework: pytorch\nversion: '2.7'\n"
            "requirements: [requirements.txt]\ngpus: none\n",
        )
        locked = project.ok("lock", *HOST)
        assert f"nvcr.io/nvidia/pytorch:{TAG}" in locked.stdout
        return project

    return make


def test_a_pinned_torchvision_is_left_to_the_image(on_standin, docker_host: str) -> None:
    project = on_standin(
        "--no-index\n--find-links /opt/wheelhouse\n"
        "--extra-index-url https://download.pytorch.org/whl/cu121\n"
        "torch==2.7.0\ntorchvision==0.22.1\nsix\n"
    )
    checked = project.ok("check")
    assert "whl/cu121 serves framework builds for another CUDA: not used" in checked.stderr
    assert "requirements.txt:5: torchvision (==0.22.1) left to the image" in checked.stderr
    built = project.ok("build")
    tag = built.stdout.strip()
    assert (
        "gpuenv: torchvision==0.22.1 (requirements.txt:5): left to the image "
        "(torchvision 0.22.0a0+standin)" in built.stderr
    )
    assert "gpuenv: torch==2.7.0 (requirements.txt:4): left to the image" in built.stderr
    versions = docker(
        "run",
        "--rm",
        tag,
        "python3",
        "-c",
        "import importlib.metadata as m; print(m.version('torch'), m.version('torchvision'))",
        host=docker_host,
    ).stdout.split()
    assert versions == ["2.7.0a0+7c8ec84dab", "0.22.0a0+standin"]


def test_a_conflicting_pin_is_explained_in_one_message(on_standin, docker_host: str) -> None:
    project = on_standin("six\nnumpy==1.26.4\n")
    registry = os.environ["GPUENV_TEST_REGISTRY"]
    pins = docker(
        "run",
        "--rm",
        f"{registry}/nvidia/pytorch:{TAG}",
        "cat",
        "/etc/pip/constraint.txt",
        host=docker_host,
    ).stdout.split()
    (numpy,) = [pin for pin in pins if pin.startswith("numpy==")]  # the wheelhouse's numpy
    result = project.gpuenv("build")
    assert result.returncode == 12, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: the project's requirements conflict with the image: numpy==1.26.4 "
        f"(requirements.txt:2): the image pins {numpy} in /etc/pip/constraint.txt; "
        "relax the pin or choose another image"
    ]
    assert "ResolutionImpossible" not in result.stderr and "Traceback" not in result.stderr
    assert docker("images", "-q", f"gpuenv/{project.name}", host=docker_host).stdout.strip() == ""
