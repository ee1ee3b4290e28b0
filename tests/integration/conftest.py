"""Integration tests run against the real services `scripts/services.sh up` starts: a
Docker engine (DOCKER_HOST) and a registry with stand-in NGC images. Under `make test`
(GPUENV_REQUIRE_DOCKER=1) and in CI (CI=true) a missing service fails the run; a
developer running pytest by hand without them gets skips that say how to start them."""

from __future__ import annotations

import ctypes
import http.server
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPUENV = [sys.executable, "-m", "gpuenv.cli"]
RTX4090 = ["--driver", "550.54.15", "--gpu", "RTX 4090"]


def _required() -> bool:
    return os.environ.get("GPUENV_REQUIRE_DOCKER") == "1" or os.environ.get("CI") == "true"


def _missing(what: str) -> None:
    message = (
        f"{what}; start the test services with `sudo scripts/services.sh up` (or run `make test`)"
    )
    if _required():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def docker_host() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    if not host or docker("image", "inspect", "gpuenv-test/busybox:1", check=False).returncode:
        _missing(f"no test Docker engine answers at DOCKER_HOST={host!r}")
    for engine in (host, os.environ.get("GPUENV_TEST_DOCKER_NOGPU", "")):
        if engine:
            clear_leftovers(engine)
    return host


# Images the tests make: gpuenv/itest-<id>, REGISTRY/itest/itest-<id>, itest-derived-...
TEST_REPOSITORY = re.compile(r"(?:^|/)itest[-/]")


def clear_leftovers(host: str) -> None:
    """Remove what an earlier run that was killed left on a test engine: containers with
    gpuenv's labels (a stopped one holds its image, which `gpuenv gc` then cannot remove)
    and the test projects' images. Only on the private engines of scripts/services.sh,
    which carry the daemon label io.gpuenv.test-engine; any other engine is left alone.
    GPUENV_TEST_SHARED=1 (several test sessions on the same services at once) skips it:
    another session's containers and images are not leftovers."""
    if os.environ.get("GPUENV_TEST_SHARED") == "1":
        return
    info = docker("info", "--format", "{{json .Labels}}", host=host, check=False)
    if "io.gpuenv.test-engine=" not in info.stdout:
        return
    listed = docker("ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Labels}}", host=host)
    # Run and job containers only: a build's intermediate containers carry the stand-in
    # base's io.gpuenv.stand-in label, and removing them would fail a concurrent build.
    kinds = ("io.gpuenv.run=", "io.gpuenv.slurm-job=")
    left = [line.split()[0] for line in listed.stdout.splitlines() if any(k in line for k in kinds)]
    if left:
        docker("rm", "-f", *left, host=host)
    tagged = docker(
        "images", "--filter", "dangling=false", "--format", "{{.Repository}}:{{.Tag}}", host=host
    )
    made = [ref for ref in tagged.stdout.split() if TEST_REPOSITORY.search(ref.rsplit(":", 1)[0])]
    if made:
        docker("rmi", "-f", *made, host=host)
    docker("image", "prune", "-f", "--filter", "label=io.gpuenv.project", host=host)


# Where gpuenv keeps a user's files (gpuenv.common.dirs); tests/conftest.py points each
# at a folder of the test's own.
USER_FOLDER_VARIABLES = (
    "GPUENV_CACHE_DIR",
    "GPUENV_CONFIG",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
)


@dataclass(frozen=True)
class Installed:
    """gpuenv as another user runs it: a wheel of this checkout installed in a folder
    that every user can read, for an interpreter every user can run."""

    python: str
    site: str

    def argv(self, *args: str) -> list[str]:
        return [self.python, "-m", "gpuenv.cli", *args]

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """The environment for another user: without this process's GPUENV_DATA_DIR,
        and without the user folders it inherited from the tests' isolation (folders of
        root's under pytest's tmp), so the user's own folders under its HOME (or those
        the test names for it) hold its overlay, cache and config, as for a user who
        runs gpuenv themselves."""
        inherited = {
            key for key in USER_FOLDER_VARIABLES if key in env and env[key] == os.environ.get(key)
        }
        own = {
            key: value
            for key, value in env.items()
            if key != "GPUENV_DATA_DIR" and key not in inherited
        }
        return {**own, "PYTHONPATH": self.site}

    @staticmethod
    def as_user(
        user: pwd.struct_passwd | int, *argv: str, groups: Sequence[int] | None = None
    ) -> list[str]:
        """`argv` run as `user` (an account, or a bare uid that is its own gid too), by
        setpriv (root only): with the account's groups, or exactly `groups` ([]: none)."""
        uid, gid = (user, user) if isinstance(user, int) else (user.pw_uid, user.pw_gid)
        if groups is None:
            joined = ["--init-groups"]
        elif groups:
            joined = [f"--groups={','.join(str(group) for group in groups)}"]
        else:
            joined = ["--clear-groups"]
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", *joined, *argv]

    def run_as(
        self,
        user: pwd.struct_passwd | int,
        *args: str,
        env: dict[str, str],
        groups: Sequence[int] | None = None,
        timeout: float = 300,
        cwd: str | Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """gpuenv ARGS as `user`, in the environment self.env(env) makes of `env`."""
        return subprocess.run(
            self.as_user(user, *self.argv(*args), groups=groups),
            capture_output=True,
            text=True,
            env=self.env(env),
            timeout=timeout,
            cwd=cwd,
        )


@dataclass
class UserProject:
    """A project handed to another user, as that user's own: the project's files are
    theirs, `folder` beside it (theirs too) holds their cache, state and data, and
    calling it runs gpuenv in the project as them, on their own `engine` (CONTAINER_HOST:
    their rootless Podman). `env` is theirs, to add to before the first call."""

    user: pwd.struct_passwd
    project: Project
    folder: Path
    env: dict[str, str]
    installed: Installed

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.installed.run_as(
            self.user, "-C", str(self.project.path), *args, env=self.env, cwd=self.project.path
        )


def as_users_own(
    installed: Installed, project: Project, user: pwd.struct_passwd, engine: str
) -> UserProject:
    """`project` made `user`'s, to run gpuenv on `engine` as them (UserProject)."""
    for root, names, files in os.walk(project.path):
        for name in [".", *names, *files]:
            os.chown(os.path.join(root, name), user.pw_uid, user.pw_gid)
    folder = project.path.parent / f"{project.name}-user"  # theirs, not in the project
    folder.mkdir()
    os.chown(folder, user.pw_uid, user.pw_gid)
    env = {
        **project.env,
        "CONTAINER_HOST": engine,
        "HOME": user.pw_dir,
        "USER": user.pw_name,
        "XDG_CACHE_HOME": str(folder / "cache"),
        "GPUENV_STATE_DIR": str(folder / "state"),
        "GPUENV_DATA_DIR": str(folder / "data"),
    }
    env.pop("DOCKER_HOST", None)
    return UserProject(user, project, folder, env, installed)


@pytest.fixture(scope="session")
def installed_for_users() -> Iterator[Installed]:
    """The checkout (or its .venv) may be private to root, as in a clone under `mktemp -d`:
    tests that run gpuenv as another user run this installation instead."""
    python = os.environ.get("GPUENV_TEST_USER_PYTHON", "")
    if not python or not os.access(python, os.X_OK):
        _missing(f"no Python for the test user at GPUENV_TEST_USER_PYTHON={python!r}")
    state = Path(os.environ.get("GPUENV_TEST_STATE", "/var/lib/gpuenv-test"))
    folder = Path(tempfile.mkdtemp(prefix="gpuenv-for-users-", dir=state))

    def pip(*args: str) -> None:
        offline = ["-q", "--no-deps", "--no-index", "--disable-pip-version-check"]
        done = subprocess.run(
            [python, "-m", "pip", args[0], *offline, *args[1:]],
            capture_output=True,
            text=True,
            cwd=folder,
        )
        assert done.returncode == 0, f"pip {args[0]} failed:\n{done.stdout}{done.stderr}"

    try:
        pip("wheel", "--no-build-isolation", "-w", str(folder / "dist"), str(REPO))
        (wheel,) = (folder / "dist").glob("gpuenv-*.whl")
        pip("install", "--target", str(folder / "site"), str(wheel))
        for root, names, files in os.walk(folder):
            for name in names + files:
                path = os.path.join(root, name)
                os.chmod(path, os.stat(path).st_mode | 0o444 | (0o111 if name in names else 0))
        folder.chmod(0o755)
        yield Installed(python, str(folder / "site"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def engine_side_server(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.HTTPServer:
    """An HTTP server on 127.0.0.1 where the test engines pull from: their own network
    namespace (GPUENV_TEST_NETNS), not this process's. Serve it with serve_forever."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler, bind_and_activate=False)
    netns = os.environ.get("GPUENV_TEST_NETNS", "")
    server.socket.close()
    server.socket = _listening_socket(netns) if netns else socket.create_server(("127.0.0.1", 0))
    server.server_address = server.socket.getsockname()[:2]
    return server


def _listening_socket(netns: str) -> socket.socket:
    """A socket keeps the network namespace it was made in: make it in a thread that
    entered NETNS (setns changes only the calling thread's), then use it from any."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def make() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns, os.O_RDONLY)
            try:
                if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                    error = ctypes.get_errno()
                    raise OSError(error, f"setns {netns}: {os.strerror(error)}")
            finally:
                os.close(fd)
            made.append(socket.create_server(("127.0.0.1", 0)))
        except BaseException as error:
            failed.append(error)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]


@pytest.fixture(scope="session")
def registry(docker_host: str) -> str:
    address = os.environ.get("GPUENV_TEST_REGISTRY", "")
    try:
        urllib.request.urlopen(f"http://{address}/v2/", timeout=3).close()
    except (OSError, ValueError):
        _missing(f"no test registry answers at GPUENV_TEST_REGISTRY={address!r}")
    return address


def registry_digest(registry: str, repository: str, tag: str) -> str:
    request = urllib.request.Request(
        f"http://{registry}/v2/{repository}/manifests/{tag}",
        method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(response.headers["Docker-Content-Digest"])


def docker(
    *args: str, host: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if host:
        env["DOCKER_HOST"] = host
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, env=env)


def engine_api(docker_host: str, method: str, path: str, body: bytes = b"") -> bytes:
    """A request to the Docker Engine API, as a client other than gpuenv sends it."""
    return subprocess.run(
        [
            "curl",
            "-sS",
            "--fail-with-body",
            "--unix-socket",
            docker_host.removeprefix("unix://"),
            "-X",
            method,
            "-H",
            "Content-Type: application/x-tar",
            "--data-binary",
            "@-",
            f"http://docker/v1.41{path}",
        ],
        input=body,
        capture_output=True,
        check=True,
        timeout=600,
    ).stdout


def images(host: str | None = None) -> set[str]:
    return set(docker("images", "-aq", host=host).stdout.split())


def containers(host: str | None = None, project: str | None = None) -> set[str]:
    """The engine's containers; with `project`, only that project's runs (the engines
    are shared with other sessions' tests, whose containers come and go meanwhile)."""
    only = ["--filter", f"label=io.gpuenv.project={project}"] if project else []
    return set(docker("ps", "-aq", *only, host=host).stdout.split())


class Project:
    """A project folder with a spec and lock, and the gpuenv CLI pointed at the services."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path = path
        self.env = env
        self.name = path.name
        self.locked: subprocess.CompletedProcess[str] | None = None  # make_project's lock

    def write(self, name: str, text: str) -> None:
        (self.path / name).write_text(text)

    def gpuenv(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*GPUENV, "-C", str(self.path), *args],
            capture_output=True,
            text=True,
            env={**self.env, **env},
            cwd=self.path,
            timeout=600,
        )

    def ok(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        result = self.gpuenv(*args, **env)
        assert result.returncode == 0, (
            f"gpuenv {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        )
        return result

    def lock_text(self) -> str:
        return (self.path / "gpuenv.lock").read_text()


@pytest.fixture
def make_project(
    tmp_path_factory: pytest.TempPathFactory, docker_host: str, registry: str
) -> Iterator[object]:
    """Projects named itest-<random>; every image they build is removed afterwards."""
    made: list[Project] = []
    cache = tmp_path_factory.mktemp("xdg-cache")
    # Under /tmp and world-traversable (pytest's own folders are not), so that tests can
    # run gpuenv as another user against these projects.
    base = Path(tempfile.mkdtemp(prefix="gpuenv-itest-", dir="/tmp"))
    base.chmod(0o755)
    # The projects' shared state folder, made as an admin makes /var/tmp/gpuenv (root's,
    # sticky, writable by all): gpuenv never makes a folder shared itself.
    (base / ".gpuenv-state").mkdir()
    (base / ".gpuenv-state").chmod(0o1777)
    # Slurm jobs of these projects belong to this session while it runs: `services.sh up`
    # cancels those of a session that has ended (interrupted before its own cleanup).
    (base / ".session-pid").write_text(f"{os.getpid()}\n")

    def make(
        spec: str = "", version: str = "2.4", requirements: str = "", *, locks: bool = True
    ) -> Project:
        """A project, locked for an RTX 4090 host (its Python packages too); with `locks`
        False, that `gpuenv lock` may fail and `project.locked` is its result."""
        name = f"itest-{uuid.uuid4().hex[:8]}"
        path = base / name
        path.mkdir()
        path.chmod(0o755)
        env = {
            **os.environ,
            "DOCKER_HOST": docker_host,
            "GPUENV_REGISTRY_MIRROR": registry,
            "XDG_CACHE_HOME": str(cache),
            "GPUENV_STATE_DIR": str(base / ".gpuenv-state"),
            "PYTHONPATH": str(REPO),
        }
        env.pop("NGC_API_KEY", None)
        project = Project(path, env)
        project.write("requirements.txt", requirements or "# no extra packages\n")
        project.write(
            "gpuenv.yaml",
            f"name: {name}\nframework: pytorch\nversion: '{version}'\nrequirements: requirements.txt\n{spec}",
        )
        project.locked = project.gpuenv("lock", *RTX4090)
        if locks:
            assert project.locked.returncode == 0, (
                f"gpuenv lock failed:\n{project.locked.stdout}\n{project.locked.stderr}"
            )
        made.append(project)
        return project

    yield make
    for project in made:
        runs = docker(
            "ps", "-aq", "--filter", f"label=io.gpuenv.project={project.name}", host=docker_host
        ).stdout.split()
        if runs:
            docker("rm", "-f", *runs, host=docker_host, check=False)
        listed = docker("images", "-q", f"gpuenv/{project.name}", host=docker_host).stdout.split()
        if listed:
            docker("rmi", "-f", *set(listed), host=docker_host, check=False)
    shutil.rmtree(base, ignore_errors=True)


def image_labels(reference: str, host: str) -> dict[str, str]:
    data = json.loads(docker("image", "inspect", reference, host=host).stdout)[0]
    return dict(data["Config"]["Labels"] or {})


def image_layers(reference: str, host: str) -> list[str]:
    data = json.loads(docker("image", "inspect", reference, host=host).stdout)[0]
    return list(data["RootFS"]["Layers"])


SLURM_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def slurm_job(job: str, prefix: Sequence[str] = (), conf: str = "") -> dict[str, str]:
    """`scontrol show job -o` of `job` as fields ({} when Slurm does not know it);
    `prefix` (nsenter) and `conf` (SLURM_CONF) reach another cluster."""
    out = subprocess.run(
        [*prefix, "scontrol", "show", "job", job, "-o"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": conf} if conf else None,
    ).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def wait_for_job(
    job: str,
    timeout: float = 120,
    *,
    prefix: Sequence[str] = (),
    conf: str = "",
    states: Sequence[str] = SLURM_ENDED,
) -> dict[str, str]:
    """The job's fields once its state is one of `states` (by default: it ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = slurm_job(job, prefix, conf)
        if fields.get("JobState") in states:
            return fields
        time.sleep(0.5)
    raise AssertionError(f"job {job} did not reach {'/'.join(states)} within {timeout}s")


def gpuenv_failed(result: subprocess.CompletedProcess[str], reason: int) -> bool:
    """`run`, `shell`, `wait` or `attach` failed itself, for `reason` (an exit code of the
    table): exit 125, as docker run's own failures, with the reason's code said, so that
    its command's own exit codes never read as gpuenv's (issue 33, item 4)."""
    return result.returncode == 125 and f"(reason {reason}:" in result.stderr


@pytest.fixture
def ports_engine() -> str:
    address = os.environ.get("GPUENV_TEST_DOCKER_PORTS", "")
    if not address or not os.path.exists(address.removeprefix("unix://")):
        _missing(f"no ports engine at GPUENV_TEST_DOCKER_PORTS={address!r}")
    return address


def in_namespace(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Python run in the services' network namespace (where the engine publishes)."""
    netns = os.environ["GPUENV_TEST_NETNS"]
    return subprocess.run(
        ["nsenter", f"--net={netns}", "python3", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
