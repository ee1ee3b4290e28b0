"""Published ports on a real engine (issue 34, item 1): the 'ports' Docker engine, whose
containers have a bridge network in the services' namespace; the published port is
reached from that namespace's loopback, where docker-proxy listens for it."""

from __future__ import annotations

import json
import os
import pwd
import re
import socket
import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.conftest import (
    Installed,
    Project,
    _missing,
    as_users_own,
    containers,
    gpuenv_failed,
    in_namespace,
)

pytestmark = pytest.mark.integration

SERVE = ["--", "python3", "-m", "http.server", "8000"]


@pytest.fixture
def project(make_project, ports_engine: str) -> Iterator[Project]:
    made = make_project(spec="gpus: none\n")
    made.env["DOCKER_HOST"] = ports_engine
    made.ok("build", "-q")
    yield made
    assert containers(ports_engine, made.name) == set(), "a run was left behind"


FETCH = """
import sys, time, urllib.request
for _ in range(100):
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=2).status); break
    except OSError:
        time.sleep(0.2)
"""


def test_a_published_port_answers_at_the_url_gpuenv_prints(project: Project) -> None:
    started = project.ok("run", "-d", "-p", "0:8000", *SERVE)
    name = started.stdout.strip()
    try:
        url = re.search(r"port 8000: (http://127\.0\.0\.1:\d+/)", started.stderr)
        assert url, started.stderr
        answered = in_namespace(FETCH, url.group(1))
        assert answered.stdout.strip() == "200", answered.stdout + answered.stderr
        listed = json.loads(project.ok("ps", "--json").stdout)
        (run,) = [r for r in listed if r["name"] == name]
        assert [p["url"] for p in run["ports"]] == [url.group(1)]
        assert run["ports"][0]["address"] == "127.0.0.1"  # loopback, never every interface
        assert "127.0.0.1:" in project.ok("ps").stdout
    finally:
        project.gpuenv("stop", name)
        project.gpuenv("rm", name)


def test_an_attached_run_says_its_url_and_every_interface_is_warned(project: Project) -> None:
    sleeps = ["python3", "-c", "import time; time.sleep(3)"]  # running when its URL is read
    result = project.ok("run", "-p", "0.0.0.0:0:8000", "--", *sleeps)
    assert re.search(r"port 8000: http://127\.0\.0\.1:\d+/", result.stderr), result.stderr
    assert "published on every interface (0.0.0.0)" in result.stderr


def test_a_host_port_in_use_here_is_refused_before_anything_starts(project: Project) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        result = project.gpuenv("run", "-p", f"{taken}:8000", *SERVE)
    assert gpuenv_failed(result, 14), result.stderr
    assert f"127.0.0.1:{taken}" in result.stderr and "-p 0:8000" in result.stderr


def test_a_port_the_engine_finds_taken_removes_the_container(project: Project) -> None:
    """Taken where the engine publishes (its namespace) but free here: the engine refuses
    at start; the container is removed and the error says what to do."""
    holder = subprocess.Popen(
        [
            "nsenter",
            f"--net={os.environ['GPUENV_TEST_NETNS']}",
            "python3",
            "-c",
            "import socket, sys, time\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        taken = int(holder.stdout.readline())
        free_here = socket.socket()
        try:
            free_here.bind(("127.0.0.1", taken))  # the host's own check passes
        except OSError:
            pytest.fail(f"port {taken} is taken on the host too: cannot test the engine's side")
        finally:
            free_here.close()
        result = project.gpuenv("run", "-p", f"{taken}:8000", *SERVE)
        assert gpuenv_failed(result, 14), result.stderr
        assert "a port it publishes is taken" in result.stderr
    finally:
        holder.kill()
        holder.wait()
    assert containers(project.env["DOCKER_HOST"], project.name) == set()


def test_an_option_before_the_command_is_never_the_command(project: Project) -> None:
    result = project.gpuenv("run", "-d", "--pulbish", "0:8000", *SERVE)
    assert result.returncode == 125, result.stderr
    assert "No such option '--pulbish'" in result.stderr
    assert result.stdout == ""  # nothing started
    assert containers(project.env["DOCKER_HOST"], project.name) == set()


def test_an_engine_without_a_network_to_forward_to_is_said(make_project) -> None:
    """The 'gpu' engine runs with --bridge=none: its containers have no network, so the
    engine publishes nothing; gpuenv says so rather than print no URL in silence."""
    project = make_project(spec="gpus: none\n")
    result = project.ok("run", "-p", "0:8000", "--", "python3", "-c", "import time; time.sleep(2)")
    assert "published no host port for 8000/tcp" in result.stderr, result.stderr


def test_a_published_port_answers_on_podman(make_project) -> None:
    """The same on Podman (its libpod API), on the test Podman whose containers get a
    network (slirp4netns): the port listens on the services' namespace's loopback."""
    address = os.environ.get("GPUENV_TEST_PODMAN_PORTS", "")
    if not address or not os.path.exists(address.removeprefix("unix://")):
        _missing(f"no test Podman with networking at GPUENV_TEST_PODMAN_PORTS={address!r}")
    project = make_project(spec="gpus: none\n")
    project.env["DOCKER_HOST"] = address
    project.ok("build", "-q")
    started = project.ok("run", "-d", "-p", "0:8000", *SERVE)
    name = started.stdout.strip()
    try:
        url = re.search(r"port 8000: (http://127\.0\.0\.1:\d+/)", started.stderr)
        assert url, started.stderr
        answered = in_namespace(FETCH, url.group(1))
        assert answered.stdout.strip() == "200", answered.stdout + answered.stderr
        (run,) = [r for r in json.loads(project.ok("ps", "--json").stdout) if r["name"] == name]
        assert [p["url"] for p in run["ports"]] == [url.group(1)]
    finally:
        project.gpuenv("stop", name)
        project.gpuenv("rm", name)
    assert containers(address, project.name) == set(), "a run was left behind"


def test_a_published_port_answers_on_rootless_podman_as_the_user(
    make_project, installed_for_users: Installed
) -> None:
    """Rootless Podman, as the user who runs it: the second test user's engine, whose
    containers get slirp4netns (rootless Podman's default), forwards the port on loopback
    through its rootlessport process, which gpuenv learns from the engine as on Docker."""
    address = os.environ.get("GPUENV_TEST_PODMAN_ROOTLESS2", "")
    if not address or not os.path.exists(address.removeprefix("unix://")):
        _missing(f"no rootless test Podman at GPUENV_TEST_PODMAN_ROOTLESS2={address!r}")
    user = pwd.getpwnam(os.environ.get("GPUENV_TEST_USER2", "gpuenv-tester2"))
    project = make_project(spec="gpus: none\n")
    as_user = as_users_own(installed_for_users, project, user, address)

    built = as_user("build", "-q")
    assert built.returncode == 0, built.stdout + built.stderr
    started = as_user("run", "-d", "-p", "0:8000", *SERVE)
    assert started.returncode == 0, started.stdout + started.stderr
    name = started.stdout.strip()
    try:
        url = re.search(r"port 8000: (http://127\.0\.0\.1:\d+/)", started.stderr)
        assert url, started.stderr
        answered = in_namespace(FETCH, url.group(1))
        assert answered.stdout.strip() == "200", answered.stdout + answered.stderr
        listed = as_user("ps", "--json")
        (run,) = [r for r in json.loads(listed.stdout) if r["name"] == name]
        assert [p["url"] for p in run["ports"]] == [url.group(1)]
    finally:
        as_user("stop", name)
        as_user("rm", name)
    assert containers(address, project.name) == set(), "a run was left behind"
