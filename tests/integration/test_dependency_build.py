"""Builds on the dependency stand-in (scripts/services.sh DEPS_STANDIN_TAGS): an image that,
like NGC PyTorch >= 25.03, carries NVIDIA-built torch 2.7.0a0+7c8ec84dab and torchvision
0.22.0a0+standin and pins them (and numpy) in /etc/pip/constraint.txt via PIP_CONSTRAINT."""

from __future__ import annotations

import os

import pytest
import yaml

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

    def make(requirements: str, *, locks: bool = True):
        """The project, locked (its Python packages too); with `locks` False, the result
        of that `gpuenv lock` is the test's to check (project.locked)."""
        project = make_project()
        project.write("requirements.txt", requirements)
        project.write(
            "gpuenv.yaml",
            f"name: {project.name}\nframework: pytorch\nversion: '2.7'\n"
            "requirements: [requirements.txt]\ngpus: none\n",
        )
        locked = project.gpuenv("lock", *HOST)
        if locks:
            assert locked.returncode == 0, locked.stderr
        assert f"nvcr.io/nvidia/pytorch:{TAG}" in locked.stdout
        project.locked = locked
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
    # The pins are checked against the image when the packages are locked.
    assert project.locked is not None
    said = project.locked.stderr
    assert (
        "torchvision==0.22.1 (requirements.txt:5): left to the image "
        "(torchvision 0.22.0a0+standin)" in said
    )
    assert "torch==2.7.0 (requirements.txt:4): left to the image" in said
    built = project.ok("build")
    tag = built.stdout.strip()
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
    project = on_standin("six\nnumpy==1.26.4\n", locks=False)
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
    # Named with both pins when the packages are locked, before anything installs; the
    # lock keeps them unresolved, and a build resolves (and refuses) the same way.
    assert project.locked is not None and project.locked.returncode == 4, project.locked
    assert "resolved: false" in project.lock_text()
    result = project.gpuenv("build")
    assert result.returncode == 4, result.stderr
    for said in (project.locked.stderr, result.stderr):
        assert [line for line in said.splitlines() if line.startswith("error:")] == [
            line for line in result.stderr.splitlines() if line.startswith("error:")
        ]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: the project's requirements conflict with the image: numpy==1.26.4 "
        f"(requirements.txt:2): the image pins {numpy} in /etc/pip/constraint.txt; "
        "relax the pin or choose another image"
    ]
    assert "ResolutionImpossible" not in result.stderr and "Traceback" not in result.stderr
    assert docker("images", "-q", f"gpuenv/{project.name}", host=docker_host).stdout.strip() == ""


def test_the_overlay_honours_the_constraint_file_and_keeps_nvidias_torch(
    on_standin, docker_host: str
) -> None:
    """A requirement that depends on torch is locked on top of NVIDIA's torch (never a
    PyPI torch); what the constraint file pins stays the image's; torch's files in the
    built image are the base's, byte for byte."""
    index = os.environ["GPUENV_TEST_INDEX"]
    project = on_standin(f"--index-url {index}\ngpuenv-needs-torch\nnumpy\ntabulate\n")
    lock = yaml.safe_load(project.lock_text())
    names = {item["name"] for item in lock["overlay"]["packages"]}
    assert names == {"gpuenv-needs-torch", "tabulate"}  # numpy: the image's, pinned
    assert lock["overlay"]["base"]["constraint_files"].keys() == {"/etc/pip/constraint.txt"}
    tag = project.ok("build").stdout.strip()
    registry = os.environ["GPUENV_TEST_REGISTRY"]
    digest = lock["image"]["digest"]
    files = (
        "import importlib.metadata as m, hashlib; d = m.distribution('torch'); "
        "print(d.version, sorted((str(f), hashlib.sha256(f.locate().read_bytes()).hexdigest()) "
        "for f in d.files or []), d.read_text('INSTALLER'))"
    )
    base = docker(
        "run",
        "--rm",
        f"{registry}/nvidia/pytorch@{digest}",
        "python3",
        "-c",
        files,
        host=docker_host,
    ).stdout
    built = docker("run", "--rm", tag, "python3", "-c", files, host=docker_host).stdout
    assert built == base and base.startswith("2.7.0a0+7c8ec84dab")
