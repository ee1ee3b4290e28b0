"""The run policy (run/launch.py) end to end against a fake engine: the image, the
grant and its claims, the container's configuration, the start, the fallback, the
outcome, and what is left behind (nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv.errors import GpuPathBroken, GpuRuntimeMissing, GpusBusy, UsageError
from gpuenv.project.overrides import Overrides
from gpuenv.resolution.host import Gpu, Host, HostPlan
from gpuenv.resolution.policy import init_project
from gpuenv.run.container import Identity
from gpuenv.run.launch import RunRequest, Services, Terminal, launch, memory_limit, oom_advice
from gpuenv.sharing.claims import ClaimStore
from tests.unit.fake_engine import FakeEngine

NO_DRIVER = 'could not select device driver "" with capabilities: [[gpu]]'
HOST = Host(
    "550.54.15",
    tuple(Gpu(i, "NVIDIA H100 80GB HBM3", uuid=f"GPU-{i}") for i in range(4)),
    "test",
)
ALICE = Identity(1000, 1000, "alice")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "requirements.txt").write_text("torch==2.3.1\n")
    init_project(str(folder), Overrides(), HostPlan("550.54.15", ("H100 80GB HBM3",)))
    return folder


@pytest.fixture
def state(tmp_path: Path) -> str:
    return str(tmp_path / "state")


def _launch(
    project: Path,
    engine: FakeEngine,
    state: str,
    request: RunRequest,
    *,
    host: Host = HOST,
    uid: int = 1000,
    notices: list[str] | None = None,
    environ: dict[str, str] | None = None,
) -> object:
    said = notices if notices is not None else []
    return launch(
        str(project),
        request,
        engine,  # type: ignore[arg-type]
        services=Services(lambda: host, lambda: ClaimStore(state), lambda: ALICE),
        terminal=Terminal(tty=False, stdin=False, uid=uid),
        environ=environ if environ is not None else {"WANDB_API_KEY": "k-7f3e9a"},
        view=lambda: _NullView(),
        notice=said.append,
    )


class _NullView:
    def pull_started(self, reference: str) -> None: ...
    def pull_event(self, progress: object) -> None: ...
    def pull_finished(self, progress: object) -> None: ...
    def build_started(self, tag: str) -> None: ...
    def build_lines(self, progress: object, lines: list[str]) -> None: ...
    def build_finished(self, progress: object) -> None: ...


def test_a_run_gets_its_grant_identity_and_exit_code(project: Path, state: str) -> None:
    engine = FakeEngine(exit_code=3)
    outcome = _launch(project, engine, state, RunRequest(("train.py", "--lr", "1"), gpus="2"))
    assert outcome.exit_code == 3  # type: ignore[attr-defined]
    [config] = engine.created
    assert config["Cmd"][-3:] == ["train.py", "--lr", "1"]
    requests = config["HostConfig"]["DeviceRequests"]
    assert requests[0]["DeviceIDs"] == ["GPU-0", "GPU-1"]
    assert config["User"] == "1000:1000"
    # The identity goes in before start; the container is removed after.
    calls = engine.calls
    upload = calls.index(("put_archive", ("c1", "/")))
    assert upload < calls.index(("start", ("c1",))) < calls.index(("remove", ("c1",)))
    assert not engine.alive
    assert ClaimStore(state).claims() == []  # released


def test_claims_hold_against_a_second_run(project: Path, state: str) -> None:
    store = ClaimStore(state)
    with store.locked():
        store.add(["GPU-0", "GPU-1", "GPU-2", "GPU-3"], "other")
    engine = FakeEngine()
    with pytest.raises(GpusBusy):
        _launch(project, engine, state, RunRequest(("train.py",), gpus="1"))
    assert engine.created == []


def test_memory_is_checked_before_anything_starts(project: Path, state: str) -> None:
    engine = FakeEngine()
    with pytest.raises(UsageError, match="--memory '1k'"):
        _launch(project, engine, state, RunRequest(("train.py",), memory="1k"))
    assert engine.calls == []
    assert memory_limit("32g") == 32 * 1024**3
    assert "raise --memory (now 8g)" in oom_advice("8g")


def test_memory_limit_and_oom_are_reported(project: Path, state: str) -> None:
    engine = FakeEngine(exit_code=137, oom_killed=True)
    outcome = _launch(project, engine, state, RunRequest(("train.py",), memory="2g"))
    assert outcome.oom_killed  # type: ignore[attr-defined]
    assert engine.created[0]["HostConfig"]["Memory"] == 2 * 1024**3


def test_optional_gpus_fall_back_when_the_engine_has_no_runtime(project: Path, state: str) -> None:
    engine = FakeEngine(refuse_start=[NO_DRIVER])
    notices: list[str] = []
    outcome = _launch(
        project, engine, state, RunRequest(("train.py",), gpus="optional"), notices=notices
    )
    assert outcome.exit_code == 0  # type: ignore[attr-defined]
    first, second = engine.created
    assert first["HostConfig"]["DeviceRequests"]
    assert not second["HostConfig"].get("DeviceRequests")
    assert any("running without GPUs" in n for n in notices)
    assert not engine.alive
    assert ClaimStore(state).claims() == []


def test_required_gpus_without_runtime_fail_and_leave_nothing(project: Path, state: str) -> None:
    engine = FakeEngine(refuse_start=[NO_DRIVER])
    with pytest.raises(GpuRuntimeMissing):
        _launch(project, engine, state, RunRequest(("train.py",), gpus="1"))
    assert not engine.alive
    assert ClaimStore(state).claims() == []


def test_root_and_root_invokers_get_no_identity(project: Path, state: str) -> None:
    engine = FakeEngine()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="none", root=True))
    _launch(project, engine, state, RunRequest(("train.py",), gpus="none"), uid=0)
    assert all("User" not in c or not c["User"] for c in engine.created)
    assert "put_archive" not in engine.names()


def test_a_shell_needs_a_terminal(project: Path, state: str) -> None:
    engine = FakeEngine()
    with pytest.raises(UsageError, match="needs a terminal"):
        _launch(project, engine, state, RunRequest(shell=True))
    assert engine.calls == []


def test_secrets_passed_through_are_not_in_labels(project: Path, state: str) -> None:
    engine = FakeEngine()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="none", env=("WANDB_API_KEY",)))
    [config] = engine.created
    assert "WANDB_API_KEY=k-7f3e9a" in config["Env"]
    assert "k-7f3e9a" not in str(config["Labels"])


def _tar(name: str, text: str) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(text.encode())
        archive.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


def test_the_images_accounts_are_read_once_at_build_time(project: Path, state: str) -> None:
    engine = FakeEngine(
        files={
            "/etc/passwd": _tar("passwd", "root:x:0:0:root:/root:/bin/bash\n"),
            "/etc/group": _tar("group", "root:x:0:\n"),
        }
    )
    _launch(project, engine, state, RunRequest(("train.py",), gpus="none"))
    # The first run builds: a probe container (never started) gives the accounts.
    assert len(engine.probes) == 1
    assert ("start", ("probe",)) not in engine.calls
    engine.calls.clear()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="none"))
    # The second comes from the build stamp: one upload, no reads, no probe.
    assert "get_archive" not in engine.names()
    assert "probe" not in engine.names()
    assert engine.names().count("put_archive") == 1


def test_a_detached_run_hands_its_claims_to_its_container(project: Path, state: str) -> None:
    from gpuenv.run.session import reap_orphans
    from gpuenv.sharing.monitor import container_check

    engine = FakeEngine()
    outcome = _launch(
        project, engine, state, RunRequest(("train.py",), gpus="1", detach=True, name="long")
    )
    container = outcome.container  # type: ignore[attr-defined]
    assert container == "c1" and engine.names_given["c1"] == "long"
    assert ("wait", ("c1",)) not in engine.calls and ("remove", ("c1",)) not in engine.calls
    config = engine.created[0]
    assert config["Labels"]["io.gpuenv.detached"] == "1" and config["Tty"] is False
    store = ClaimStore(state, container_check=container_check(engine))  # type: ignore[arg-type]
    (claim,) = store.claims()
    assert claim.container == "c1" and claim.pid == 0  # no gpuenv process holds it
    # No orphan: the launching process is gone, but a started detached run is left alone.
    engine.listed = [
        {"Id": "c1", "State": "running", "Labels": {**config["Labels"], "io.gpuenv.pid": "1"}}
    ]
    assert reap_orphans(engine) == []  # type: ignore[arg-type]
    with pytest.raises(GpusBusy, match="container c1"):
        _launch(project, engine, state, RunRequest(("train.py",), gpus="device=" + "0"))
    engine.exit("c1")  # its command ends; nobody runs gpuenv meanwhile
    assert store.claims() == []


def test_name_needs_detach(project: Path, state: str) -> None:
    with pytest.raises(UsageError, match="--name names a detached run"):
        _launch(project, FakeEngine(), state, RunRequest(("train.py",), name="x"))


def test_orphans_are_runs_whose_process_is_certainly_gone() -> None:
    import os
    import socket

    from gpuenv.run.session import reap_orphans
    from gpuenv.sharing.procfs import process_start

    def run(name: str, pid: int, start: str, **labels: str) -> dict[str, object]:
        return {
            "Id": name,
            "Names": [f"/{name}"],
            "State": "running",
            "Labels": {
                "io.gpuenv.run": "1",
                "io.gpuenv.host": socket.gethostname(),
                "io.gpuenv.pid": str(pid),
                "io.gpuenv.pid-start": start,
                **labels,
            },
        }

    me = os.getpid()
    engine = FakeEngine(
        listed=[
            run("dead", 2**22 - 1, "1"),
            run("alive", me, process_start(me)),
            run("detached", 2**22 - 1, "1", **{"io.gpuenv.detached": "1"}),
            run("elsewhere", 2**22 - 1, "1", **{"io.gpuenv.host": "another-host"}),
        ]
    )
    assert reap_orphans(engine) == ["dead"]  # type: ignore[arg-type]


def _cdi_engine(tmp_path: Path, version: str = "0.8.0") -> tuple[FakeEngine, dict[str, str]]:
    specs = tmp_path / "cdi"
    specs.mkdir()
    devices = [{"name": f"GPU-{i}", "containerEdits": {}} for i in range(4)]
    devices.append({"name": "all", "containerEdits": {}})
    (specs / "nvidia.json").write_text(
        json.dumps({"cdiVersion": version, "kind": "nvidia.com/gpu", "devices": devices})
    )
    engine = FakeEngine(
        version_data={"Version": "28.2.2", "ApiVersion": "1.50"},
        info_data={"CDISpecDirs": [str(specs)]},
    )
    return engine, {"GPUENV_CDI_SPEC_DIRS": str(specs)}


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("2", ["nvidia.com/gpu=GPU-0", "nvidia.com/gpu=GPU-1"]),
        ("device=3", ["nvidia.com/gpu=GPU-3"]),
        ("all", ["nvidia.com/gpu=all"]),
    ],
)
def test_cdi_engines_get_cdi_device_requests(
    project: Path, state: str, tmp_path: Path, gpus: str, expected: list[str]
) -> None:
    engine, environ = _cdi_engine(tmp_path)
    _launch(project, engine, state, RunRequest(("train.py",), gpus=gpus), environ=environ)
    [config] = engine.created
    assert config["HostConfig"]["DeviceRequests"] == [{"Driver": "cdi", "DeviceIDs": expected}]
    # What the container is told does not depend on the path.
    visible = "all" if gpus == "all" else ",".join(e.split("=")[1] for e in expected)
    assert f"NVIDIA_VISIBLE_DEVICES={visible}" in config["Env"]


def test_a_spec_podman_cannot_read_stops_the_run(project: Path, state: str, tmp_path: Path) -> None:
    engine, environ = _cdi_engine(tmp_path, version="0.6.0")
    engine.version_data = {
        "Version": "4.3.1",
        "ApiVersion": "1.41",
        "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}],
    }
    with pytest.raises(GpuPathBroken) as raised:
        _launch(project, engine, state, RunRequest(("train.py",), gpus="1"), environ=environ)
    assert raised.value.exit_code == 22
    assert "cdiVersion 0.6.0, but podman 4.3.1 reads CDI specs up to 0.5.0" in raised.value.message
    assert engine.created == []
    assert ClaimStore(state).claims() == []


def test_docker_falls_back_to_the_legacy_request_past_an_unreadable_spec(
    project: Path, state: str, tmp_path: Path
) -> None:
    engine, environ = _cdi_engine(tmp_path, version="1.1.0")
    _launch(project, engine, state, RunRequest(("train.py",), gpus="1"), environ=environ)
    [config] = engine.created
    assert config["HostConfig"]["DeviceRequests"][0]["Capabilities"] == [["gpu"]]


def test_an_old_engine_keeps_the_legacy_request(project: Path, state: str, tmp_path: Path) -> None:
    engine, environ = _cdi_engine(tmp_path)
    engine.version_data = {"Version": "20.10.24", "ApiVersion": "1.41"}
    _launch(project, engine, state, RunRequest(("train.py",), gpus="1"), environ=environ)
    [config] = engine.created
    assert config["HostConfig"]["DeviceRequests"] == [
        {"DeviceIDs": ["GPU-0"], "Capabilities": [["gpu"]]}
    ]
    assert ("info", ()) not in engine.calls  # API 1.41 cannot say anything of CDI


def test_optional_gpus_run_without_them_when_no_cdi_device_fits(
    project: Path, state: str, tmp_path: Path
) -> None:
    engine, environ = _cdi_engine(tmp_path, version="0.6.0")
    engine.version_data = {
        "Version": "4.3.1",
        "ApiVersion": "1.41",
        "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}],
    }
    notices: list[str] = []
    outcome = _launch(
        project,
        engine,
        state,
        RunRequest(("train.py",), gpus="optional"),
        environ=environ,
        notices=notices,
    )
    assert outcome.exit_code == 0  # type: ignore[attr-defined]
    [config] = engine.created
    assert "DeviceRequests" not in config["HostConfig"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["Env"]
    assert any("cannot give the GPUs through CDI" in n and "optional" in n for n in notices)
