"""Builds with dependency caches, on the real engines: Docker's BuildKit (through the Engine
API) and Podman's buildah, rootful and rootless. Packages come from the test services'
package index on loopback (scripts/services/pypi.sh), whose access log says what each
build downloaded."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from .conftest import (
    GPUENV,
    RTX4090,
    Project,
    _missing,
    docker,
    engine_api,
)

pytestmark = pytest.mark.integration
WHEEL = re.compile(r"\bGET /wheels/([^/ ]+\.whl)")


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
# Where each Podman service keeps buildah's cache mounts: its own TMPDIR (services/podman.sh).
PODMAN_TMP = {
    "podman": "GPUENV_TEST_PODMAN_TMP",
    "podman-rootless": "GPUENV_TEST_PODMAN_ROOTLESS_TMP",
}


def empty_caches(engine: str, address: str) -> None:
    """The engine's dependency caches, emptied: the next build starts cold."""
    if engine == "docker":
        engine_api(address, "POST", "/build/prune?all=1")
        return
    tmp = os.environ.get(PODMAN_TMP[engine], "")
    if not tmp or not Path(tmp).is_dir():
        _missing(f"no TMPDIR of the {engine} service ({PODMAN_TMP[engine]})")
    shutil.rmtree(Path(tmp) / "buildah-cache", ignore_errors=True)


def unique(package: str) -> str:
    """`package`, spelled for this test alone (a version no release has, excluded): the
    same install, but no builder's layer cache has the step, so the dependency caches
    are what a rebuild reuses."""
    return f"{package}!=0.0.{uuid.uuid4().int % 10**9}"


@pytest.fixture(params=list(ENGINES))
def engine_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The environment that points gpuenv at one engine; the test's images are removed
    from it afterwards (Docker's: by make_project)."""
    variable, extra = ENGINES[request.param]
    address = os.environ.get(variable, "")
    if not address:
        _missing(f"no {request.param} engine for builds ({variable})")
    yield {
        "DOCKER_HOST": address,
        "CONTAINER_HOST": address,
        "GPUENV_TEST_ENGINE": request.param,
        **extra,
    }
    if request.param != "docker":
        made = docker("images", "--format", "{{.Repository}}:{{.Tag}}", host=address).stdout
        mine = [ref for ref in made.split() if "itest-" in ref]
        if mine:
            docker("rmi", "-f", *mine, host=address, check=False)


def requirements(url: str, *packages: str) -> str:
    """A requirements file on the test index. pip keeps downloads from a plain-http index
    in its cache only for a trusted host (https ones always): as users of an in-house http
    mirror write it."""
    host = url.split("/")[2].split(":")[0]
    return f"--index-url {url}\n--trusted-host {host}\n" + "".join(f"{p}\n" for p in packages)


def test_a_second_build_downloads_only_the_new_requirement(
    make_project: Callable[..., Project], index: tuple[str, Path], engine_env: dict[str, str]
) -> None:
    url, log = index
    tqdm = unique("tqdm")
    project = make_project(requirements=requirements(url, tqdm, "einops"))
    empty_caches(engine_env["GPUENV_TEST_ENGINE"], engine_env["DOCKER_HOST"])
    first = Downloads(log)
    built = project.ok("build", **engine_env)
    assert first.wheels() == ["einops", "tqdm", "uv"]
    # Live progress, as a log shows it: the steps, the install's own lines.
    assert "gpuenv: installing with uv 0.13.9" in built.stderr
    assert "pip-install.sh" in built.stderr
    project.write("requirements.txt", requirements(url, tqdm, "einops", "tabulate"))
    project.ok("lock", *RTX4090)
    second = Downloads(log)
    rebuilt = project.ok("build", **engine_env)
    assert second.wheels() == ["tabulate"]  # the cached wheels reused, uv's too
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


@pytest.mark.parametrize("made_by", ["root, the cache folder", "root, the build's own folder"])
def test_a_cache_podman_cannot_use_never_fails_the_build(
    make_project: Callable[..., Project], index: tuple[str, Path], made_by: str
) -> None:
    """Rootless Podman 4.3 keeps its cache mounts in $TMPDIR/buildah-cache, shared by every
    user of that TMPDIR. When another user (here root) made that folder first, buildah
    cannot make this build's folder in it: the build runs again without cache mounts.
    When another user made this build's own folder, buildah mounts it: the install step
    sees it is not this user's and installs without it. Either way, one warning and an
    image, and nothing read from the other user's folder."""
    url, _ = index
    address = os.environ.get("GPUENV_TEST_PODMAN_ROOTLESS", "")
    tmp = Path(os.environ.get("GPUENV_TEST_PODMAN_ROOTLESS_TMP", "/nonexistent"))
    if not address or not tmp.is_dir():
        _missing("no rootless Podman with a TMPDIR of its own (GPUENV_TEST_PODMAN_ROOTLESS_TMP)")
    caches = tmp / "buildah-cache"
    saved = tmp / "buildah-cache.saved"
    if caches.exists():
        caches.rename(saved)
    try:
        caches.mkdir(mode=0o755)  # root's: the rootless service (gpuenv-tester) cannot write it
        if made_by.endswith("own folder"):
            planted = caches / f"gpuenv-python-{os.getuid()}"
            (planted / "uv").mkdir(parents=True)
            (planted / "uv" / "planted").write_text("another user's file\n")
        project = make_project(requirements=requirements(url, "einops"))
        env = {"DOCKER_HOST": address, "CONTAINER_HOST": address, "GPUENV_ENGINE": "podman"}
        built = project.ok("build", **env)
        warnings = [line for line in built.stderr.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1, built.stderr
        if made_by.endswith("own folder"):
            assert "not using the dependency cache (/root/.cache)" in warnings[0]
            assert "another user's" in warnings[0]
        else:
            assert "could not use gpuenv's dependency cache (mkdir " in warnings[0]
            assert "/buildah-cache/gpuenv-python-" in warnings[0]
        shown = project.gpuenv(
            "run", "--gpus", "none", "--", "python3", "-c", "import einops", **env
        )
        assert shown.returncode == 0, shown.stderr
    finally:
        shutil.rmtree(caches, ignore_errors=True)
        if saved.exists():
            saved.rename(caches)
        made = docker("images", "--format", "{{.Repository}}:{{.Tag}}", host=address).stdout
        mine = [ref for ref in made.split() if "itest-" in ref]
        if mine:
            docker("rmi", "-f", *mine, host=address, check=False)


def test_gc_caches_empties_the_dependency_caches(
    make_project: Callable[..., Project], index: tuple[str, Path], docker_host: str
) -> None:
    """What gc --caches lists and removes are gpuenv's caches: the next build downloads
    again, and a cache mount of someone else's Dockerfile is left alone."""
    url, log = index
    einops = unique("einops")  # the install step runs: no layer an earlier run cached
    project = make_project(requirements=requirements(url, einops))
    project.ok("build")
    other = build_with_cache_mount(docker_host)
    try:
        listed = project.ok("gc", "--caches")
        assert re.search(r"would remove \d+ dependency caches?", listed.stderr), listed.stderr
        removed = project.ok("gc", "--caches", "--yes")
        assert "dependency cache" in removed.stderr and "freed" in removed.stderr
        assert "no dependency caches to remove" in project.ok("gc", "--caches").stderr
        assert other in cache_mount_ids(docker_host), (
            "a cache mount that is not gpuenv's was removed"
        )
    finally:
        docker("rmi", "-f", "itest-othercache:1", host=docker_host, check=False)
        filters = quote(json.dumps({"id": [other]}))
        engine_api(docker_host, "POST", f"/build/prune?filters={filters}")
    project.write("requirements.txt", requirements(url, einops, "tabulate"))
    project.ok("lock", *RTX4090)
    again = Downloads(log)
    project.ok("build")
    assert again.wheels() == ["einops", "tabulate", "uv"]  # everything again: uv too


def cache_mount_ids(docker_host: str) -> set[str]:
    rows = json.loads(engine_api(docker_host, "GET", "/system/df"))["BuildCache"] or []
    return {row["ID"] for row in rows if row["Type"] == "exec.cachemount"}


def tar_of(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build_with_cache_mount(docker_host: str) -> str:
    """Someone else's BuildKit build with a cache mount of its own; its record's id."""
    before = cache_mount_ids(docker_host)
    mark = uuid.uuid4().hex  # a cache of its own: one an earlier run left is not new
    dockerfile = (
        f"FROM {os.environ['GPUENV_TEST_REGISTRY']}/nvidia/pytorch:24.06-py3\n"
        f"RUN --mount=type=cache,id=itest-other-{mark},target=/var/cache/other "
        f"sh -c 'echo {mark} > /var/cache/other/x'\n"
    )
    context = tar_of({"Dockerfile": dockerfile})
    engine_api(docker_host, "POST", "/build?version=2&t=itest-othercache:1", context)
    made = cache_mount_ids(docker_host) - before
    assert made, "the build made no cache mount"
    return made.pop()


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
        "ls -A /root/.cache 2>/dev/null; ls /opt /tmp; command -v uv || true",
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
    project = make_project()
    project.write("requirements.txt", requirements(url, "gpuenv-needs-torch"))
    project.write(
        "gpuenv.yaml",
        f"name: {project.name}\nframework: pytorch\nversion: '2.7'\n"
        "requirements: requirements.txt\n",
    )
    project.ok("lock", "--driver", "570.86.10", "--gpu", "RTX 4090")
    built = project.ok("build")
    tag = built.stdout.strip()
    # torch's files as its installation lists them (RECORD), and its dist-info: the
    # stand-in's torch is a dist-info alone, a real one its package too.
    files = (
        "import hashlib, pathlib\n"
        "from importlib import metadata\n"
        "dist = metadata.distribution('torch')\n"
        "paths = {pathlib.Path(str(dist.locate_file(f))) for f in dist.files or ()}\n"
        "paths |= set(pathlib.Path(str(dist._path)).rglob('*'))\n"
        "for path in sorted(p for p in paths if p.is_file()):\n"
        "    print(hashlib.sha256(path.read_bytes()).hexdigest(), path)\n"
    )
    registry = os.environ["GPUENV_TEST_REGISTRY"]
    base = f"{registry}/nvidia/pytorch:25.03-py3"
    before = docker("run", "--rm", base, "python3", "-c", files, host=docker_host).stdout
    after = docker("run", "--rm", tag, "python3", "-c", files, host=docker_host).stdout
    assert before and before == after
    versions = (
        "from importlib.metadata import version as v; print(v('gpuenv-needs-torch'), v('torch'))"
    )
    installed = docker("run", "--rm", tag, "python3", "-c", versions, host=docker_host).stdout
    assert installed.split() == ["1.0", "2.7.0a0+7c8ec84dab"]  # installed, on the image's torch


def test_a_requirement_that_cannot_be_installed(
    make_project: Callable[..., Project], index: tuple[str, Path], docker_host: str
) -> None:
    url, _ = index
    project = make_project(
        requirements=requirements(url, "tqdm", "no-such-package-gpuenv"), locks=False
    )
    # Found when the packages are locked (exit 4), and by a build that locks them.
    assert project.locked is not None and project.locked.returncode == 4
    failed = project.gpuenv("build")
    assert failed.returncode == 4, failed.stderr
    # pip's own reason, and where the requirement is written.
    for said in (project.locked.stderr, failed.stderr):
        assert (
            "error: a requirement could not be resolved: no-such-package-gpuenv "
            "(requirements.txt:4): No matching distribution found for no-such-package-gpuenv"
        ) in said, said
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
    built = engine_api(
        docker_host, "POST", "/build?version=2&networkmode=host&t=itest-rendered:1", archive
    )
    try:
        assert b'"moby.image.id"' in built, built[-2000:]
        shown = docker(
            "run", "--rm", "itest-rendered:1", "python3", "-c", "import einops", host=docker_host
        )
        assert shown.returncode == 0
    finally:
        docker("rmi", "-f", "itest-rendered:1", host=docker_host, check=False)
