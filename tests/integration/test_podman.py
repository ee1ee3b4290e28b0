"""`gpuenv build` and `gpuenv run` on a real Podman (Debian 12's 4.3.1), rootful and
rootless (as the unprivileged test user), with GPUs given through a CDI spec the test
writes. Its device nodes are stand-ins: /dev/nvidia0 and /dev/nvidia1 in the container
are the host's /dev/null and /dev/zero (CDI's deviceNodes hostPath), so a container that
sees a node got exactly that CDI device."""

from __future__ import annotations

import json
import os
import pwd
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuenv.engine.podman import PodmanEngine

from .conftest import (
    Installed,
    Project,
    _missing,
    as_users_own,
    gpuenv_failed,
    registry_digest,
)

pytestmark = pytest.mark.integration

UUIDS = ["GPU-0a0a0a0a-0000-4000-8000-000000000000", "GPU-1b1b1b1b-0000-4000-8000-000000000001"]
NODES = {UUIDS[0]: ("/dev/nvidia0", "/dev/null"), UUIDS[1]: ("/dev/nvidia1", "/dev/zero")}
SPEC_NAME = "gpuenv-itest.json"
SHOW = (
    "ls /dev | grep '^nvidia' | tr '\\n' ' '; echo; echo $NVIDIA_VISIBLE_DEVICES $GPUENV_CDI_NODE"
)


def cdi_spec(
    version: str = "0.5.0", nodes: dict[str, tuple[str, str]] = NODES
) -> dict[str, object]:
    devices = [
        {
            "name": uuid,
            "containerEdits": {
                "deviceNodes": [{"path": path, "hostPath": host_path}],
                "env": [f"GPUENV_CDI_NODE_{index}={path}"],
            },
        }
        for index, (uuid, (path, host_path)) in enumerate(nodes.items())
    ]
    return {"cdiVersion": version, "kind": "nvidia.com/gpu", "devices": devices}


def _service(variable: str) -> str:
    address = os.environ.get(variable, "")
    path = address.removeprefix("unix://")
    if not address or not os.path.exists(path):
        _missing(f"no test Podman service at {variable}={address!r}")
    return address


@pytest.fixture
def cdi_dir() -> Iterator[Path]:
    folder = Path(os.environ.get("GPUENV_TEST_CDI_DIR", ""))
    if not folder.is_dir():
        _missing(f"no CDI spec folder for the test Podman at GPUENV_TEST_CDI_DIR={folder}")
    spec = folder / SPEC_NAME
    spec.write_text(json.dumps(cdi_spec()))
    spec.chmod(0o644)
    yield folder
    spec.unlink(missing_ok=True)


@pytest.fixture
def rootful(make_project, cdi_dir: Path, tmp_path: Path) -> Iterator[Project]:
    address = _service("GPUENV_TEST_PODMAN")
    engine = PodmanEngine(address)
    before = {c["Id"] for c in engine.containers("io.gpuenv.run")}
    made = make_project(spec="gpus: all\n")
    host = tmp_path / "host.json"
    gpus = [{"index": i, "name": "NVIDIA GeForce RTX 4090", "uuid": u} for i, u in enumerate(UUIDS)]
    host.write_text(json.dumps({"driver": "550.54.15", "gpus": gpus}))
    made.env.update(
        DOCKER_HOST=address,
        GPUENV_CDI_SPEC_DIRS=str(cdi_dir),
        GPUENV_HOST_FILE=str(host),
    )
    made.ok("build", "-q")
    yield made
    assert {c["Id"] for c in engine.containers("io.gpuenv.run")} == before
    for image in engine.images(f"io.gpuenv.project={made.name}"):
        engine.remove_image(image.id)


def _lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


def test_cdi_devices_rootful(rootful: Project) -> None:
    one = _lines(rootful.ok("run", "--gpus", "device=1", "--", "sh", "-c", SHOW + "_1"))
    assert one[0].split() == ["nvidia1"]
    assert one[1].split() == [UUIDS[1], "/dev/nvidia1"]
    every = _lines(rootful.ok("run", "--gpus", "all", "--", "sh", "-c", SHOW + "_0"))
    assert every[0].split() == ["nvidia0", "nvidia1"]
    assert every[1].split() == ["all", "/dev/nvidia0"]
    none = _lines(rootful.ok("run", "--gpus", "none", "--", "sh", "-c", SHOW))
    assert none[0].strip() == ""
    assert rootful.gpuenv("run", "--", "sh", "-c", "exit 7").returncode == 7


def test_doctor_names_the_cdi_path(rootful: Project) -> None:
    result = rootful.gpuenv("doctor")
    assert "Podman: " in result.stdout and "Podman 4.3.1 (rootful)" in result.stdout
    assert (
        f"GPU path: cdi: CDI, 2 nvidia.com/gpu device(s) in {SPEC_NAME}"
        in result.stdout.replace(str(Path(os.environ["GPUENV_TEST_CDI_DIR"])) + "/", "")
    )


def test_a_spec_too_new_for_podman(rootful: Project, cdi_dir: Path) -> None:
    (cdi_dir / SPEC_NAME).write_text(json.dumps(cdi_spec("0.6.0")))
    result = rootful.gpuenv("run", "--gpus", "device=0", "--", "true")
    assert gpuenv_failed(result, 22), result.stderr
    assert "cdiVersion 0.6.0, but podman 4.3.1 reads CDI specs up to 0.5.0" in result.stderr
    assert "Traceback" not in result.stderr
    doctor = rootful.gpuenv("doctor")
    assert "fail GPU path" in doctor.stdout, doctor.stdout


def test_ctrl_c_stops_and_removes_rootful(rootful: Project) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuenv.cli", "-C", str(rootful.path), "run", "--", "sleep", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=rootful.env,
    )
    engine = PodmanEngine(rootful.env["DOCKER_HOST"])
    deadline = time.monotonic() + 60
    while not [
        c
        for c in engine.containers(f"io.gpuenv.project={rootful.name}", all=False)
        if c.get("State") == "running"
    ]:
        assert time.monotonic() < deadline, "the run's container never started"
        time.sleep(0.2)
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - started < 15
    assert process.returncode == 130, stderr
    assert engine.containers(f"io.gpuenv.project={rootful.name}") == []


def test_rootless_as_the_user(make_project, cdi_dir: Path, installed_for_users: Installed) -> None:
    address = _service("GPUENV_TEST_PODMAN_ROOTLESS")
    user = pwd.getpwnam(os.environ.get("GPUENV_TEST_USER", "gpuenv-tester"))
    project = make_project(spec="gpus: all\n")
    as_user = as_users_own(installed_for_users, project, user, address)
    host = as_user.folder / "host.json"  # readable by the user, not in the project
    gpus = [{"index": i, "name": "NVIDIA GeForce RTX 4090", "uuid": u} for i, u in enumerate(UUIDS)]
    host.write_text(json.dumps({"driver": "550.54.15", "gpus": gpus}))
    as_user.env.update(GPUENV_CDI_SPEC_DIRS=str(cdi_dir), GPUENV_HOST_FILE=str(host))

    engine = PodmanEngine(address)
    try:
        built = as_user("build", "-q")
        assert built.returncode == 0, built.stdout + built.stderr
        # Rootless Podman binds a node from its own path: the renaming spec is refused
        # before anything starts, and doctor says why.
        refused = as_user("run", "--gpus", "device=0", "--", "true")
        assert gpuenv_failed(refused, 22), refused.stdout + refused.stderr
        assert "rootless Podman binds device nodes from their own path" in refused.stderr
        # The stand-in nodes of the test folder, at their own paths.
        stand_ins = cdi_dir.parent / "dev"
        nodes = {u: (str(stand_ins / f"nvidia{i}"),) * 2 for i, u in enumerate(UUIDS)}
        (cdi_dir / SPEC_NAME).write_text(json.dumps(cdi_spec(nodes=nodes)))
        show = (
            "touch written.txt && mkdir -p out && id -u && "
            f"ls {stand_ins} | tr '\\n' ' '; echo; echo $NVIDIA_VISIBLE_DEVICES $GPUENV_CDI_NODE_1"
        )
        result = as_user("run", "--gpus", "device=1", "--", "sh", "-c", show)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == str(user.pw_uid)
        assert lines[1].split() == ["nvidia1"]
        assert lines[2].split() == [UUIDS[1], str(stand_ins / "nvidia1")]
        for name in ("written.txt", "out"):
            info = (project.path / name).stat()
            assert (info.st_uid, info.st_gid) == (user.pw_uid, user.pw_gid)
        assert as_user("run", "--", "sh", "-c", "exit 3").returncode == 3
        doctor = as_user("doctor")
        assert "Podman 4.3.1 (rootless)" in doctor.stdout, doctor.stdout + doctor.stderr
        assert "--userns=keep-id" in doctor.stdout
        assert engine.containers(f"io.gpuenv.project={project.name}") == []
    finally:
        for image in engine.images(f"io.gpuenv.project={project.name}"):
            engine.remove_image(image.id)


def test_ps_and_stop_rootful(rootful: Project) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuenv.cli",
            "-C",
            str(rootful.path),
            "run",
            "--gpus",
            "1",
            "--",
            "sleep",
            "300",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=rootful.env,
    )
    deadline = time.monotonic() + 60
    mine: list[dict[str, object]] = []
    while not mine:
        assert time.monotonic() < deadline, "the run never showed in gpuenv ps"
        listed = json.loads(rootful.ok("ps", "--json").stdout)
        mine = [run for run in listed if run["project"] == rootful.name]
        time.sleep(0.3)
    assert mine[0]["gpus"] == UUIDS[0]
    rootful.ok("stop", str(mine[0]["name"]))
    process.communicate(timeout=60)
    assert process.returncode == 143  # SIGTERM, as after docker stop
    assert [
        r
        for r in json.loads(rootful.ok("ps", "--all", "--json").stdout)
        if r["project"] == rootful.name
    ] == []


def test_pull_pins_the_digest_and_images_lists_the_build_rootful(
    make_project, registry: str
) -> None:
    address = _service("GPUENV_TEST_PODMAN")
    engine = PodmanEngine(address)
    project = make_project()
    expected = registry_digest(registry, "nvidia/pytorch", "24.06-py3")
    # The test Podman's storage is its own: make this pull really download.
    for reference in (
        f"{registry}/nvidia/pytorch@{expected}",
        f"{registry}/nvidia/pytorch:24.06-py3",
    ):
        if engine.has_image(reference):
            engine.remove_image(reference)
    pulled = project.ok("pull", DOCKER_HOST=address)
    assert f"digest: {expected}" in project.lock_text()
    assert pulled.stdout.strip() == f"{registry}/nvidia/pytorch@{expected}"
    assert engine.repo_digests(f"{registry}/nvidia/pytorch@{expected}")
    try:
        project.ok("build", "-q", DOCKER_HOST=address)
        listed = project.ok("images", DOCKER_HOST=address)
        assert project.name in listed.stdout
    finally:
        for image in engine.images(f"io.gpuenv.project={project.name}"):
            engine.remove_image(image.id)


def _process_with(*words: bytes, program: bytes = b"") -> int | None:
    """The pid of a process whose command line has every one of `words`, run as a
    program whose path ends with `program` (None: none)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(program) and all(word in argv for word in words):
            return int(entry)
    return None


def _service_process(address: str) -> int:
    """The pid of the `podman system service` that listens on `address` (its command
    line names the socket)."""
    pid = _process_with(b"service", address.encode(), program=b"podman")
    assert pid is not None, f"no podman process serves {address}"
    return pid


def test_a_run_asks_for_no_rlimit_the_service_cannot_grant(rootful: Project) -> None:
    """The test service's nproc is below this process's: a run still starts (runc
    would fail with "error setting rlimit type 6" if gpuenv asked for this process's
    own), with the service's limit, or Podman's default where the service may raise."""
    address = rootful.env["DOCKER_HOST"]
    pid = _service_process(address)
    limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
    row = next(line for line in limits if line.startswith("Max processes")).split()
    service = resource.RLIM_INFINITY if row[3] == "unlimited" else int(row[3])
    _, mine = resource.getrlimit(resource.RLIMIT_NPROC)
    assert mine == resource.RLIM_INFINITY or mine > service, (
        f"the test service's nproc ({service}) is not below this process's ({mine}): "
        "the case is not exercised"
    )
    status = Path(f"/proc/{pid}/status").read_text()
    effective = int(status.split("CapEff:")[1].split()[0], 16)
    can_raise = os.stat(f"/proc/{pid}").st_uid == 0 and effective >> 24 & 1
    shown = rootful.ok("run", "--gpus", "none", "--", "cat", "/proc/self/limits").stdout
    row = next(line for line in shown.splitlines() if line.startswith("Max processes"))
    assert int(row.split()[3]) == (1048576 if can_raise else min(service, 1048576)), shown


def _keeper_of(container: str) -> int:
    """The pid of the keeper that holds a detached run's claims (its command line names
    the container)."""
    pid = _process_with(b"gpuenv.cli.keeper", container.encode())
    assert pid is not None, f"no keeper holds the claims of {container}"
    return pid


def test_two_users_with_their_own_rootless_engines_never_share_a_gpu(
    make_project, cdi_dir: Path, installed_for_users: Installed
) -> None:
    """Issue 33, item 1: each user runs their own rootless Podman, so neither engine can
    answer for the other's containers. Two detached runs, one per user, on a host of two
    GPUs, never get one GPU; a third waits its turn; a run that ends, or whose keeper is
    killed, frees its GPU for the other user's next command."""
    addresses = [_service("GPUENV_TEST_PODMAN_ROOTLESS"), _service("GPUENV_TEST_PODMAN_ROOTLESS2")]
    users = [
        pwd.getpwnam(os.environ.get(name, default))
        for name, default in (
            ("GPUENV_TEST_USER", "gpuenv-tester"),
            ("GPUENV_TEST_USER2", "gpuenv-tester2"),
        )
    ]
    stand_ins = cdi_dir.parent / "dev"
    nodes = {u: (str(stand_ins / f"nvidia{i}"),) * 2 for i, u in enumerate(UUIDS)}
    (cdi_dir / SPEC_NAME).write_text(json.dumps(cdi_spec(nodes=nodes)))
    projects, runners, engines = [], [], []
    for user, address in zip(users, addresses, strict=True):
        project = make_project(spec="gpus: 1\n")
        run = as_users_own(installed_for_users, project, user, address)
        # the projects' shared state folder (root's, sticky): one for both users
        run.env["GPUENV_STATE_DIR"] = project.env["GPUENV_STATE_DIR"]
        host = run.folder / "host.json"
        gpus = [
            {"index": i, "name": "NVIDIA A100-SXM4-80GB", "uuid": u} for i, u in enumerate(UUIDS)
        ]
        host.write_text(json.dumps({"driver": "550.54.15", "gpus": gpus}))
        run.env.update(GPUENV_CDI_SPEC_DIRS=str(cdi_dir), GPUENV_HOST_FILE=str(host))
        projects.append(project)
        runners.append(run)
        engines.append(PodmanEngine(address))
    alice, bob = runners
    try:
        for run in runners:
            built = run("build", "-q")
            assert built.returncode == 0, built.stdout + built.stderr
        first = alice("run", "-d", "--", "sleep", "300")
        assert first.returncode == 0, first.stderr
        second = bob("run", "-d", "--", "sleep", "300")
        assert second.returncode == 0, second.stderr
        containers = [first.stdout.strip(), second.stdout.strip()]

        def gpu_of(engine: PodmanEngine, name: str) -> str:
            labels = engine.inspect(name)["Config"]["Labels"]
            return labels["io.gpuenv.gpus"]

        held = [gpu_of(e, c) for e, c in zip(engines, containers, strict=True)]
        assert sorted(held) == sorted(UUIDS), held  # one each, never the same one
        busy = alice("run", "--", "true")
        assert gpuenv_failed(busy, 16), busy.stderr
        # the detached runs holding the GPUs, named by their claims as `gpuenv ps` names them
        assert any(f"run {name}" in busy.stderr for name in containers), busy.stderr

        # Bob's run ends (killed through his own engine): its keeper frees the GPU, and
        # Alice's next command gets it, without Bob running gpuenv.
        engines[1].kill(containers[1], "KILL")
        deadline = time.monotonic() + 60
        while True:
            done = alice("run", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES")
            if done.returncode == 0:
                break
            assert gpuenv_failed(done, 16) and time.monotonic() < deadline, done.stderr
            time.sleep(0.5)
        assert done.stdout.strip() == held[1]

        # Alice's keeper is killed (SIGKILL): as for a killed run, the kernel drops its
        # locks and Bob's next command gets the GPU.
        keeper = _keeper_of(engines[0].inspect(containers[0])["Id"])
        os.kill(keeper, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            done = bob("run", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES")
            if done.returncode == 0:
                break
            assert time.monotonic() < deadline, done.stderr
            time.sleep(0.5)
        assert done.stdout.strip() in UUIDS
    finally:
        for engine, project in zip(engines, projects, strict=True):
            for container in engine.containers(f"io.gpuenv.project={project.name}"):
                engine.remove(container["Id"])
            for image in engine.images(f"io.gpuenv.project={project.name}"):
                engine.remove_image(image.id)
