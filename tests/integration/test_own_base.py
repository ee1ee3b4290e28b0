"""A base image of the team's own (issue 31, item 2), on a stand-in in the test
registry: the CPU torch stand-in, given the environment NVIDIA's CUDA images carry. gpuenv
pulls it, reads its configuration and probes it, pins its digest, checks it against the
host like a matrix row, builds on it and runs it."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest
import yaml

from tests.integration.conftest import RTX4090, docker, registry_digest

pytestmark = pytest.mark.integration

REQUIRE = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=535,driver<536"


@pytest.fixture(scope="module")
def own_base(docker_host: str, registry: str) -> Iterator[str]:
    """registry/team/train:<random>: the torch stand-in with CUDA_VERSION and
    NVIDIA_REQUIRE_CUDA set, pushed, and not left in the engine (gpuenv pulls it)."""
    source = os.environ.get("GPUENV_TEST_TORCH_IMAGE", "")
    assert source, "no GPUENV_TEST_TORCH_IMAGE: run scripts/services.sh up"
    reference = f"{registry}/team/train:{uuid.uuid4().hex[:8]}"
    docker("pull", "-q", source, host=docker_host)
    container = docker("create", source, "true", host=docker_host).stdout.strip()
    try:
        docker(
            "commit",
            "--change",
            "ENV CUDA_VERSION=12.4.1",
            "--change",
            f'ENV NVIDIA_REQUIRE_CUDA="{REQUIRE}"',
            container,
            reference,
            host=docker_host,
        )
    finally:
        docker("rm", "-f", container, host=docker_host, check=False)
    docker("push", "-q", reference, host=docker_host)
    docker("rmi", reference, host=docker_host)
    yield reference
    docker("rmi", "-f", reference, host=docker_host, check=False)


def test_own_base_is_read_pinned_checked_built_and_run(
    make_project, own_base: str, registry: str, docker_host: str
) -> None:
    project = make_project(f"base: '{own_base}'\n", version="2.13", locks=False)
    assert project.locked is not None and project.locked.returncode == 0, project.locked.stderr
    lock = yaml.safe_load(project.lock_text())
    repository, tag = own_base.split("/", 1)[1].rsplit(":", 1)
    assert lock["image"] == {
        "reference": own_base,
        "digest": registry_digest(registry, repository, tag),
    }
    resolved = lock["resolved"]
    assert resolved["framework_version"].startswith("2.13.0")
    assert resolved["cuda"] == "12.4.1" and resolved["python"] == "3.11"
    assert "torch.__version__ (probe)" in resolved["read_from"]
    assert "CUDA_VERSION" in resolved["read_from"]
    assert lock["requires"]["min_driver"] == "550.54.15"
    assert lock["requires"]["forward_compat"] == ["470", "535"]
    # The CPU build carries no GPU code: said, not guessed.
    assert "GPU architectures" in project.locked.stderr

    # The same driver and GPU checks as any image.
    old = project.gpuenv("resolve", "--driver", "535.104.05", "--gpu", "RTX 4090")
    assert old.returncode == 4, old.stderr
    assert "needs driver ≥ 550.54.15" in old.stderr

    # A re-lock after an unrelated edit reads nothing: no engine needed.
    spec = (project.path / "gpuenv.yaml").read_text()
    project.write("gpuenv.yaml", spec + "shm_size: 2g\n")
    relocked = project.gpuenv("lock", *RTX4090, DOCKER_HOST="unix:///nonexistent.sock")
    assert relocked.returncode == 0, relocked.stderr
    assert yaml.safe_load(project.lock_text())["image"]["digest"] == lock["image"]["digest"]

    project.ok("build", "-q")
    ran = project.ok(
        "run", "--gpus", "none", "python3", "-c", "import torch; print(torch.__version__)"
    )
    assert ran.stdout.strip().startswith("2.13.0")
    left = docker("ps", "-aq", "--filter", "label=io.gpuenv.probe", host=docker_host).stdout.split()
    assert left == []  # the probe's container never stays


def test_a_version_the_own_base_lacks_is_refused(make_project, own_base: str) -> None:
    project = make_project(f"base: '{own_base}'\n", version="2.4", locks=False)
    assert project.locked is not None and project.locked.returncode == 4
    assert "has PyTorch 2.13.0" in project.locked.stderr
    assert not (project.path / "gpuenv.lock").exists()


def test_an_own_base_the_registry_lacks_is_a_pull_error(make_project, registry: str) -> None:
    missing = f"{registry}/team/missing:1"
    project = make_project(f"base: '{missing}'\n", locks=False)
    assert project.locked is not None and project.locked.returncode == 11, project.locked.stderr
    assert missing in project.locked.stderr
    assert "fix `base:` in gpuenv.yaml" in project.locked.stderr
    assert "Traceback" not in project.locked.stderr


def test_resolve_json_names_the_own_base(make_project, own_base: str) -> None:
    project = make_project(f"base: '{own_base}'\n", version="2.13")
    answer = json.loads(project.ok("resolve", "--json", *RTX4090).stdout)
    assert answer["image"] == own_base
