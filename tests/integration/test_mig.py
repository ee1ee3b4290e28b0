"""MIG instances end to end, read through the scripted NVML: reserved under concurrency
with whole GPUs on the real dockerd (the legacy request, the stand-in NVIDIA hook), shown
by top, and passed by CDI on the real rootful Podman with a spec the test writes whose
device nodes are stand-ins (/dev/null, /dev/zero, /dev/full): a container that sees a
node got exactly that MIG device."""

from __future__ import annotations

import itertools
import json
import os
import pwd
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuenv.engine.podman import PodmanEngine
from tests.scripted_nvml import ScriptedNvml, gpu, mig_gpu, mig_uuid, scenario

from ..jsonschemas import validate_output
from .conftest import Installed, Project, as_users_own, docker, gpuenv_failed
from .test_podman import _service
from .test_shared import _container, _popen

pytestmark = pytest.mark.integration

M00, M01, M02 = mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(0, 2)
GPU0 = "GPU-00000000-1111-2222-3333-444444444444"
SPEC_NAME = "gpuenv-itest-mig.json"  # beside test_podman's own spec, never in its place
# nvidia-ctk names MIG devices by UUID or by "<gpu>:<mig>": two of each kind here.
NODES = {M00: ("/dev/nvidia-mig0", "/dev/null"), M01: ("/dev/nvidia-mig1", "/dev/zero")}
BY_INDEX = {"0:2": ("/dev/nvidia-mig2", "/dev/full")}
SHOW = "ls /dev | grep '^nvidia' | tr '\\n' ' '; echo; echo $NVIDIA_VISIBLE_DEVICES"


def machine() -> dict[str, object]:
    """GPU 0 in MIG mode (1g.10gb, 1g.10gb, 2g.20gb), GPU 1 whole."""
    return scenario(mig_gpu(0, "1g.10gb", "1g.10gb", "2g.20gb"), gpu(1))


@pytest.fixture
def mig_project(make_project, tmp_path: Path) -> tuple[Project, ScriptedNvml]:
    project = make_project(spec="gpus: {mig: 1g.10gb, count: 1}\n")
    project.ok("build", "-q")
    scripted = ScriptedNvml(tmp_path)
    scripted.write(machine())
    project.env.pop("GPUENV_HOST_FILE", None)
    project.env.update(scripted.env)
    project.env["GPUENV_STATE_DIR"] = str(tmp_path / "state")
    return project, scripted


def test_instances_and_their_gpu_never_overlap(mig_project: tuple[Project, ScriptedNvml]) -> None:
    """Four runs of the spec (one 1g.10gb each: there are two) and one of GPU 0 whole,
    all at once through the claims: no instance twice at a time, GPU 0 never whole
    while one of its instances is in use."""
    project, _ = mig_project
    script = "echo $NVIDIA_VISIBLE_DEVICES $(date +%s.%N); sleep 2; date +%s.%N"
    runs = [_popen(project, "run", "--wait", "--", "sh", "-c", script) for _ in range(4)]
    runs.append(_popen(project, "run", "--gpus", GPU0, "--wait", "--", "sh", "-c", script))
    spans: list[tuple[str, float, float]] = []
    for process in runs:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        first, last = out.strip().splitlines()
        device, start = first.split()
        spans.append((device, float(start), float(last)))
    devices = [d for d, _, _ in spans]
    assert devices.count(GPU0) == 1 and set(devices) - {GPU0} <= {M00, M01}
    for (a, start_a, end_a), (b, start_b, end_b) in itertools.combinations(spans, 2):
        if a == b or GPU0 in (a, b):
            assert end_a <= start_b or end_b <= start_a, f"{a} and {b} were held at once"


def test_a_named_instance_reaches_the_engine_and_top(
    mig_project: tuple[Project, ScriptedNvml],
) -> None:
    project, _ = mig_project
    process = _popen(project, "run", "--gpus", M02, "--", "sleep", "300")
    try:
        container = _container(project)
        inspect = json.loads(docker("inspect", container).stdout)[0]
        (request,) = inspect["HostConfig"]["DeviceRequests"]
        assert request["DeviceIDs"] == [M02] and request["Capabilities"] == [["gpu"]]
        assert f"NVIDIA_VISIBLE_DEVICES={M02}" in inspect["Config"]["Env"]
        # GPU 0 cannot be had whole while its instance runs; the other instances can.
        busy = project.gpuenv("run", "--gpus", GPU0, "--", "true")
        assert gpuenv_failed(busy, 16), busy.stderr
        assert f"GPU 0 (MIG): MIG {M02[:12]}: held by" in busy.stderr
        assert project.name in busy.stderr
        other = project.ok("run", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES")
        assert other.stdout.strip() == M00
        snapshot = validate_output("top", project.ok("top", "--json").stdout)
        instances = {m["uuid"]: m for m in snapshot["gpus"][0]["mig"]}
        assert instances[M02]["claimed_by"]["project"] == project.name
        assert instances[M02]["utilization"] is None
        assert instances[M00]["claimed_by"] is None
        table = project.ok("top", "--once", COLUMNS="220")
        (row,) = [line for line in table.stdout.splitlines() if line.split()[:1] == ["0:2"]]
        assert "MIG 2g.20gb" in row and "n/a" in row and project.name in row
        assert "utilization n/a" in table.stderr
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    left = docker("ps", "-aq", "--filter", f"label=io.gpuenv.project={project.name}").stdout
    assert left.strip() == ""


@pytest.fixture
def podman_mig(mig_project: tuple[Project, ScriptedNvml]) -> Iterator[Project]:
    folder = Path(os.environ.get("GPUENV_TEST_CDI_DIR", ""))
    address = _service("GPUENV_TEST_PODMAN")
    devices = [
        {"name": name, "containerEdits": {"deviceNodes": [{"path": path, "hostPath": host}]}}
        for name, (path, host) in {**NODES, **BY_INDEX}.items()
    ]
    spec = folder / SPEC_NAME
    spec.write_text(
        json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices})
    )
    spec.chmod(0o644)
    project, _ = mig_project
    engine = PodmanEngine(address)
    before = {c["Id"] for c in engine.containers("io.gpuenv.run")}
    project.env.update(DOCKER_HOST=address, GPUENV_CDI_SPEC_DIRS=str(folder))
    try:
        project.ok("build", "-q")
        yield project
    finally:
        spec.unlink(missing_ok=True)
        assert {c["Id"] for c in engine.containers("io.gpuenv.run")} == before
        for image in engine.images(f"io.gpuenv.project={project.name}"):
            engine.remove_image(image.id)


def _seen(result: object) -> tuple[list[str], list[str]]:
    assert getattr(result, "returncode", 1) == 0, result
    nodes, visible = str(getattr(result, "stdout", "")).splitlines()[:2]
    return sorted(nodes.split()), visible.split(",")


def test_podman_gets_exactly_the_instances_by_cdi(podman_mig: Project) -> None:
    # The spec's one 1g.10gb, named by UUID in the CDI spec.
    nodes, visible = _seen(podman_mig.ok("run", "--", "sh", "-c", SHOW))
    assert (nodes, visible) == (["nvidia-mig0"], [M00])
    two = podman_mig.ok("run", "--gpus", "mig=1g.10gb,count=2", "--", "sh", "-c", SHOW)
    assert _seen(two) == (["nvidia-mig0", "nvidia-mig1"], [M00, M01])
    # The 2g.20gb, named "0:2" (nvidia-ctk's index strategy) in the CDI spec.
    index = podman_mig.ok("run", "--gpus", "mig=2g.20gb", "--", "sh", "-c", SHOW)
    assert _seen(index) == (["nvidia-mig2"], [M02])
    # An instance no CDI device names: refused before anything starts, its claim released.
    spec = Path(os.environ["GPUENV_TEST_CDI_DIR"]) / SPEC_NAME
    data = json.loads(spec.read_text())
    data["devices"] = [d for d in data["devices"] if d["name"] != M01]
    spec.write_text(json.dumps(data))
    missing = podman_mig.gpuenv("run", "--gpus", M01, "--", "true")
    assert gpuenv_failed(missing, 22), missing.stderr
    assert f"no CDI device gives MIG instance {M01}" in missing.stderr
    snapshot = validate_output("top", podman_mig.ok("top", "--json").stdout)
    assert [m["claimed_by"] for m in snapshot["gpus"][0]["mig"]] == [None, None, None]
    doctor = podman_mig.gpuenv("doctor")
    assert "GPU 0 MIG" in doctor.stdout and f"0:2 2g.20gb, 19968 MiB {M02}" in doctor.stdout
    (path,) = [line for line in doctor.stdout.splitlines() if "GPU path" in line]
    assert path.startswith("warn") and "no CDI device for" in path and M01 in path


def test_rootless_podman_as_the_user_with_a_described_host(
    make_project, installed_for_users: Installed
) -> None:
    """Rootless Podman, as the unprivileged test user, with the MIG instances described in
    a host file and CDI nodes at their own paths (rootless Podman binds them from there):
    the spec's instance, then one named by UUID whose CDI device is named "<gpu>:<mig>"."""
    address = _service("GPUENV_TEST_PODMAN_ROOTLESS")
    folder = Path(os.environ.get("GPUENV_TEST_CDI_DIR", ""))
    user = pwd.getpwnam(os.environ.get("GPUENV_TEST_USER", "gpuenv-tester"))
    project = make_project(spec="gpus: {mig: 1g.10gb, count: 1}\n")
    as_user = as_users_own(installed_for_users, project, user, address)
    mine = as_user.folder
    instances = [
        {"uuid": M00, "profile": "1g.10gb", "index": 0},
        {"uuid": M01, "profile": "1g.10gb", "index": 1},
    ]
    host = mine / "host.json"
    host.write_text(
        json.dumps(
            {
                "driver": "550.54.15",
                "gpus": [
                    {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "uuid": GPU0, "mig": instances}
                ],
            }
        )
    )
    stand_ins = folder.parent / "dev"  # nvidia0 and nvidia1, made by scripts/services.sh
    devices = [
        {"name": name, "containerEdits": {"deviceNodes": [{"path": str(stand_ins / node)}]}}
        for name, node in ((M00, "nvidia0"), ("0:1", "nvidia1"))
    ]
    spec = folder / SPEC_NAME
    spec.write_text(
        json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices})
    )
    spec.chmod(0o644)
    as_user.env.update(GPUENV_CDI_SPEC_DIRS=str(folder), GPUENV_HOST_FILE=str(host))

    engine = PodmanEngine(address)
    show = f"touch mig.txt; ls {stand_ins} | tr '\\n' ' '; echo; echo $NVIDIA_VISIBLE_DEVICES"
    try:
        built = as_user("build", "-q")
        assert built.returncode == 0, built.stdout + built.stderr
        first = as_user("run", "--", "sh", "-c", show)
        assert _seen(first) == (["nvidia0"], [M00])
        second = as_user("run", "--gpus", M01, "--", "sh", "-c", show)
        assert _seen(second) == (["nvidia1"], [M01])
        info = (project.path / "mig.txt").stat()
        assert (info.st_uid, info.st_gid) == (user.pw_uid, user.pw_gid)
        assert engine.containers(f"io.gpuenv.project={project.name}") == []
    finally:
        spec.unlink(missing_ok=True)
        for image in engine.images(f"io.gpuenv.project={project.name}"):
            engine.remove_image(image.id)
