"""Builds with dependency caches, on the real engines: Docker's BuildKit (through the Engine
API) and Podman's buildah, rootful and rootless. Packages come from the test services'
package index on loopback (scripts/services/pypi.sh), whose access log says what each
build downloaded."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import GPUENV, Project, _missing, docker

pytestmark = pytest.mark.integration
WHEEL = re.compile(r'"GET /wheels/([^/ ]+\.whl)')


@pytest.fixture(scope="session")
def index() -> tuple[str, Path]:
    """The package index on loopback: its URL and its access log."""
    url, log = os.environ.get("GPUENV_TEST_INDEX"), os.environ.get("GPUENV_TEST_INDEX_LOG")
    if not url or not log or not Path(log).exists():
        _missing("no test package index (GPUENV_TEST_INDEX)")
    assert url and log
    return url, Path(log)


class Downloads:
    """The wheels the index served from now on (its log is shared: only what follows)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.start = log.stat().st_size

    def wheels(self) -> list[str]:
        with self.log.open("rb") as handle:
            handle.seek(self.start)
            text = handle.read().decode(errors="replace")
        return sorted({match.group(1).split("-")[0].lower() for match in WHEEL.finditer(text)})


ENGINES = {
    "docker": ("DOCKER_HOST", {}),
    "podman": ("GPUENV_TEST_PODMAN", {"GPUENV_ENGINE": "podman"}),
    "podman-rootless": ("GPUENV_TEST_PODMAN_ROOTLESS", {"GPUENV_ENGINE": "podman"}),
}


@pytest.fixture(params=list(ENGINES))
def engine_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The environment that points gpuenv at one engine; the test's images are removed
    from it afterwards (Docker's: by make_project)."""
    variable, extra = ENGINES[request.param]
    address = os.environ.get(variable, "")
    if not address:
        _missing(f"no {request.param} engine for builds ({variable})")
    yield {"DOCKER_HOST": address, "CONTAINER_HOST": address, **extra}
    if request.param != "docker":
        made = docker("images", "--format", "{{.Repository}}:{{.Tag}}", host=address).stdout
        mine = [ref for ref in made.split() if "itest-" in ref]
        if mine:
            docker("rmi", "-f", *mine, host=address, check=False)


def requirements(url: str, *packages: str) -> str:
    return f"--index-url {url}\n" + "".join(f"{p}\n" for p in packages)


def test_a_second_build_downloads_only_the_new_requirement(
    make_project: Callable[..., Project], index: tuple[str, Path], engine_env: dict[str, str]
) -> None:
    url, log = index
    project = make_project(requirements=requirements(url, "tqdm", "einops"))
    first = Downloads(log)
    built = project.ok("build", **engine_env)
    assert first.wheels() == ["einops", "tqdm", "uv"]
    # Live progress, as a log shows it: the steps, the install's own lines.
    assert "gpuenv: installing with uv 0.13.9" in built.stderr
    assert "pip-install.sh" in built.stderr
    project.write("requirements.txt", requirements(url, "tqdm", "einops", "tabulate"))
    second = Downloads(log)
    rebuilt = project.ok("build", **engine_env)
    assert second.wheels() == ["tabulate"]  # the cached wheels, and uv's own stage, reused
    assert "cached" in rebuilt.stderr
    tag = rebuilt.stdout.strip()
    shown = subprocess.run(
        [
            *GPUENV,
            "-C",
            str(project.path),
            "run",
            "--gpus",
            "none",
            "--",
            "python3",
            "-c",
            "import tabulate, tqdm, einops; print('ok')",
        ],
        capture_output=True,
        text=True,
        env={**project.env, **engine_env},
        timeout=300,
    )
    assert shown.stdout.strip() == "ok", shown.stderr
    assert tag.startswith(f"gpuenv/{project.name}:")


def test_the_image_carries_no_cache_and_no_uv(
    make_project: Callable[..., Project], index: tuple[str, Path], docker_host: str
) -> None:
    url, _ = index
    project = make_project(requirements=requirements(url, "tqdm"))
    tag = project.ok("build").stdout.strip()
    listed = docker(
        "run",
        "--rm",
        tag,
        "sh",
        "-c",
        "ls -A /root/.cache 2>/dev/null; ls /opt; command -v uv || true",
        host=docker_host,
    ).stdout.split()
    assert "pip" not in listed and "uv" not in listed and "gpuenv-uv" not in listed


def test_a_package_that_needs_torch_keeps_the_images_torch(
    make_project: Callable[..., Project], index: tuple[str, Path], docker_host: str
) -> None:
    """The dependency stand-in carries NVIDIA-built torch (pinned in its pip constraint
    file): a requirement that depends on torch never replaces a file of it."""
    url, _ = index
    tags = os.environ.get("GPUENV_TEST_DEPS_STANDIN_TAGS", "").split()
    if "25.03-py3" not in tags:
        _missing("no dependency stand-in in the registry")
    project = make_project(version="2.7", requirements=requirements(url, "gpuenv-needs-torch"))
    project.ok("lock", "--driver", "570.86.10", "--gpu", "RTX 4090")
    built = project.ok("build")
    tag = built.stdout.strip()
    files = (
        'python3 -c "import torch, os; print(os.path.dirname(torch.__file__))" | '
        "xargs -I{} find {} -type f -exec sha256sum {{}} + | sort"
    )
    registry = os.environ["GPUENV_TEST_REGISTRY"]
    base = f"{registry}/nvidia/pytorch:25.03-py3"
    before = docker("run", "--rm", base, "sh", "-c", files, host=docker_host).stdout
    after = docker("run", "--rm", tag, "sh", "-c", files, host=docker_host).stdout
    assert before and before == after
    import_it = docker(
        "run", "--rm", tag, "python3", "-c", "import gpuenv_needs_torch", host=docker_host
    )
    assert import_it.returncode == 0


def test_a_requirement_that_cannot_be_installed(
    make_project: Callable[..., Project], index: tuple[str, Path], docker_host: str
) -> None:
    url, _ = index
    project = make_project(requirements=requirements(url, "tqdm", "no-such-package-gpuenv"))
    failed = project.gpuenv("build")
    assert failed.returncode == 12, failed.stderr
    assert "build failed at" in failed.stderr and "pip-install.sh" in failed.stderr
    assert "no-such-package-gpuenv" in failed.stderr
    assert "Traceback" not in failed.stderr
    listed = docker("images", "-q", f"gpuenv/{project.name}", host=docker_host).stdout.split()
    assert listed == []  # nothing half-built is tagged


def test_ctrl_c_stops_a_build_and_tags_nothing(
    make_project: Callable[..., Project], index: tuple[str, Path], docker_host: str
) -> None:
    url, _ = index
    project = make_project(
        requirements=requirements(url, "scipy", "pandas", "scikit-learn", "matplotlib")
    )
    child = subprocess.Popen(
        [*GPUENV, "-C", str(project.path), "build"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=project.env,
    )
    assert child.stderr is not None
    deadline = time.monotonic() + 120
    for line in child.stderr:
        if "pip-install.sh" in line or time.monotonic() > deadline:
            break
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=60) == 130
    listed = docker("images", "-q", f"gpuenv/{project.name}", host=docker_host).stdout.split()
    assert listed == []
    # The engine stopped the build: the next one starts at once and finishes.
    assert project.ok("build").stdout.startswith(f"gpuenv/{project.name}:")


def test_render_writes_a_context_that_builds_elsewhere(
    make_project: Callable[..., Project], index: tuple[str, Path], docker_host: str, tmp_path: Path
) -> None:
    """What `gpuenv render --context` writes builds with BuildKit outside gpuenv, the
    cache mounts included (here through the Engine API, as buildx would ask)."""
    url, _ = index
    project = make_project(requirements=requirements(url, "einops"))
    project.ok("pull")
    context = tmp_path / "context"
    rendered = project.ok("render", "--context", str(context))
    assert "--mount=type=cache" in rendered.stdout
    assert (context / "Dockerfile").read_text() == rendered.stdout
    archive = subprocess.run(
        ["tar", "-C", str(context), "-c", "."], capture_output=True, check=True
    ).stdout
    built = subprocess.run(
        [
            "curl",
            "-sS",
            "--unix-socket",
            docker_host.removeprefix("unix://"),
            "-X",
            "POST",
            "-H",
            "Content-Type: application/x-tar",
            "--data-binary",
            "@-",
            "http://docker/v1.41/build?version=2&networkmode=host&t=itest-rendered:1",
        ],
        input=archive,
        capture_output=True,
        timeout=600,
    )
    try:
        assert b'"moby.image.id"' in built.stdout, built.stdout[-2000:]
        shown = docker(
            "run", "--rm", "itest-rendered:1", "python3", "-c", "import einops", host=docker_host
        )
        assert shown.returncode == 0
    finally:
        docker("rmi", "-f", "itest-rendered:1", host=docker_host, check=False)
