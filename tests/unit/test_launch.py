"""The run policy (containers/launch.py) end to end against a fake engine: the image, the
grant and its claims, the container's configuration, the start, the fallback, the
outcome, and what is left behind (nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv.app.init import init_project
from gpuenv.app.launch import RunRequest, Services, Terminal, launch, memory_limit, oom_advice
from gpuenv.common.versions import DriverVersion
from gpuenv.containers.config import Identity
from gpuenv.errors import GpuPathBroken, GpuRuntimeMissing, GpusBusy, UsageError
from gpuenv.host.machine import Gpu, Host
from gpuenv.project.overrides import Overrides
from gpuenv.reservations.claims import ClaimStore
from gpuenv.resolution.hostplan import HostPlan
from tests.unit.conftest import Keepers
from tests.unit.fake_engine import FakeEngine, lock_packages

NO_DRIVER = 'could not select device driver "" with capabilities: [[gpu]]'
HOST = Host(
    DriverVersion.parse("550.54.15"),
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
    lock_packages(str(folder))
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
    # The build made alice's account image (passwd, group, HOME): the run uploads nothing.
    [(account, committed)] = engine.committed
    assert config["Image"] == account and account.endswith("-u1000")
    assert committed["Labels"]["io.gpuenv.account"] == "1000:1000:alice"
    calls = engine.calls
    assert ("put_archive", ("account", "/")) in calls
    assert ("put_archive", ("c1", "/")) not in calls
    assert calls.index(("start", ("c1",))) < calls.index(("remove", ("c1",)))
    # The exit code is asked once the output has ended, before the removal.
    assert calls.index(("start", ("c1",))) < calls.index(("wait", ("c1",)))
    assert calls.index(("wait", ("c1",))) < calls.index(("remove", ("c1",)))
    assert not engine.alive
    assert ClaimStore(state).claims() == []  # released


@pytest.mark.parametrize(
    "spoil",
    [
        lambda configs, tag: configs.pop(tag),  # removed (gpuenv gc, docker rmi)
        lambda configs, tag: configs[tag]["Labels"].update({"io.gpuenv.account": "1:1:eve"}),
        lambda configs, tag: configs[tag]["Labels"].update({"io.gpuenv.account-base": "x:1"}),
    ],
    ids=["missing", "another-user", "another-image"],
)
def test_an_account_image_that_does_not_check_out_is_not_used(
    project: Path, state: str, spoil: object
) -> None:
    """The run then uploads the passwd/group entries into its own container, before start."""
    engine = FakeEngine()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="1"))
    [(account, _)] = engine.committed
    spoil(engine.image_configs, account)  # type: ignore[operator]
    engine.calls.clear()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="1"))
    config = engine.created[-1]
    assert config["Image"] == account.removesuffix("-u1000")
    assert config["User"] == "1000:1000"
    calls = engine.calls
    upload = calls.index(("put_archive", ("c2", "/")))
    assert upload < calls.index(("start", ("c2",))) < calls.index(("remove", ("c2",)))


def test_a_root_run_has_no_account_image(project: Path, state: str) -> None:
    engine = FakeEngine()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="1"), uid=0)
    assert engine.committed == []
    assert engine.created[-1]["User"] == ""
    assert "put_archive" not in engine.names()


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
    # The first run builds: a probe container (never started) gives the accounts, and
    # another (never started either) becomes alice's account image.
    assert len(engine.probes) == 1
    assert ("start", ("probe",)) not in engine.calls
    assert ("start", ("account",)) not in engine.calls
    assert engine.names().count("commit") == 1
    engine.calls.clear()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="none"))
    # The second comes from the build stamp: the account image, checked with one request;
    # no reads, no probe, no upload.
    assert "get_archive" not in engine.names()
    assert "probe" not in engine.names()
    assert "put_archive" not in engine.names()
    assert engine.names().count("image_config") == 1
    assert "has_image" not in engine.names()


def test_a_detached_run_hands_its_claims_to_its_keeper(
    project: Path, state: str, keepers: Keepers
) -> None:
    from gpuenv.containers.session import reap_orphans

    engine = FakeEngine()
    outcome = _launch(
        project, engine, state, RunRequest(("train.py",), gpus="1", detach=True, name="long")
    )
    container = outcome.container  # type: ignore[attr-defined]
    assert container == "c1" and engine.names_given["c1"] == "long"
    assert ("wait", ("c1",)) not in engine.calls and ("remove", ("c1",)) not in engine.calls
    config = engine.created[0]
    assert config["Labels"]["io.gpuenv.detached"] == "1" and config["Tty"] is False
    assert list(keepers.held) == ["c1"]  # the keeper holds the claims from now on
    store = ClaimStore(state)
    (claim,) = store.claims()
    assert claim.container == "c1" and claim.pid == 0  # no gpuenv process holds it
    assert claim.run == "long"  # named as `gpuenv ps` names the run
    # No orphan: the launching process is gone, but a started detached run is left alone.
    engine.listed = [
        {"Id": "c1", "State": "running", "Labels": {**config["Labels"], "io.gpuenv.pid": "1"}}
    ]
    assert reap_orphans(engine) == []  # type: ignore[arg-type]
    with pytest.raises(GpusBusy, match="run long"):
        _launch(project, engine, state, RunRequest(("train.py",), gpus="device=" + "0"))
    keepers.end("c1")  # its command ends: the keeper lets the claims go
    assert store.claims() == []


def test_name_needs_detach(project: Path, state: str) -> None:
    with pytest.raises(UsageError, match="--name names a detached run"):
        _launch(project, FakeEngine(), state, RunRequest(("train.py",), name="x"))


def test_orphans_are_runs_whose_process_is_certainly_gone() -> None:
    import os
    import socket

    from gpuenv.containers.session import reap_orphans
    from gpuenv.host.procfs import process_start

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


def test_the_account_image_holds_the_users_entries_and_home(project: Path, state: str) -> None:
    import io
    import tarfile

    engine = FakeEngine(
        files={
            "/etc/passwd": _tar("passwd", "root:x:0:0:root:/root:/bin/bash\n"),
            "/etc/group": _tar("group", "root:x:0:\n"),
        }
    )
    _launch(project, engine, state, RunRequest(("train.py",), gpus="none"))
    [(tag, config)] = engine.committed
    assert config["Labels"]["io.gpuenv.account-base"] == tag.removesuffix("-u1000")
    assert config["Cmd"] == ["bash"]  # the image's own, not the never-run container's
    with tarfile.open(fileobj=io.BytesIO(engine.uploaded["account"])) as archive:
        members = {m.name: m for m in archive.getmembers()}
        passwd = archive.extractfile("etc/passwd").read().decode()  # type: ignore[union-attr]
    assert passwd.splitlines()[-1] == "alice:x:1000:1000::/home/alice:/bin/bash"
    home = members["home/alice"]
    assert home.isdir() and (home.uid, home.gid, home.mode) == (1000, 1000, 0o755)
    assert ("start", ("account",)) not in engine.calls
    assert ("remove", ("account",)) in engine.calls


OLD_DRIVER = Host(  # too old for the locked image, and no forward compatibility on GeForce
    DriverVersion.parse("535.104.05"),
    tuple(Gpu(i, "NVIDIA GeForce RTX 4090", uuid=f"GPU-{i}") for i in range(4)),
    "test",
)


def test_a_host_the_image_cannot_run_on_is_refused_before_the_start(
    project: Path, state: str
) -> None:
    """The preflight runs while the container is created: refused, it never starts and
    is removed, and the GPUs are released."""
    from gpuenv.errors import ResolutionError

    engine = FakeEngine()
    with pytest.raises(ResolutionError, match="this host cannot run the locked image"):
        _launch(project, engine, state, RunRequest(("train.py",), gpus="1"), host=OLD_DRIVER)
    assert "start" not in engine.names()
    assert not engine.alive
    assert ClaimStore(state).claims() == []


def test_the_refusal_comes_before_a_usage_error(project: Path, state: str) -> None:
    """As when the preflight ran first: a host that cannot run the image is the error
    reported, even with a bad -e beside it."""
    from gpuenv.errors import ResolutionError

    engine = FakeEngine()
    request = RunRequest(("train.py",), gpus="1", env=("1BAD=x",))
    with pytest.raises(ResolutionError):
        _launch(project, engine, state, request, host=OLD_DRIVER)
    with pytest.raises(UsageError, match="not a variable name"):
        _launch(project, engine, state, request)


def test_force_skips_the_preflight(project: Path, state: str) -> None:
    engine = FakeEngine()
    request = RunRequest(("train.py",), gpus="1", force=True)
    assert _launch(project, engine, state, request, host=OLD_DRIVER).exit_code == 0  # type: ignore[attr-defined]


def test_the_engine_is_asked_for_its_gpu_path_once_and_not_for_gpus_none(
    project: Path, state: str, tmp_path: Path
) -> None:
    """The engine's facts are asked beside the image lookup (Docker 28: one GET /info,
    its answer used for the device requests); a run with --gpus none asks nothing."""
    engine, environ = _cdi_engine(tmp_path)
    _launch(project, engine, state, RunRequest(("train.py",), gpus="1"), environ=environ)
    assert engine.names().count("info") == 1
    assert engine.created[0]["HostConfig"]["DeviceRequests"][0]["Driver"] == "cdi"
    engine.calls.clear()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="none"), environ=environ)
    assert "info" not in engine.names()


def test_a_detached_runs_claim_holds_while_its_container_starts(project: Path, state: str) -> None:
    """The claims pass to the container only once it runs: a run that looks while the
    engine is still starting it (a created container holds nothing) still sees the GPU
    as taken, by this process."""
    seen: list[list[tuple[str, int, str]]] = []

    class Starting(FakeEngine):
        def start(self, container: str) -> None:
            store = ClaimStore(state)
            seen.append([(c.gpu, c.pid, c.container) for c in store.claims()])
            store.close()
            super().start(container)

    engine = Starting()
    _launch(project, engine, state, RunRequest(("train.py",), gpus="1", detach=True))
    import os

    assert seen == [[("GPU-0", os.getpid(), "")]]
    store = ClaimStore(state)
    assert [(c.gpu, c.pid, c.container) for c in store.claims()] == [("GPU-0", 0, "c1")]


def test_a_create_the_engine_refuses_reports_the_hosts_refusal_first(
    project: Path, state: str
) -> None:
    """The preflight runs beside the create: when the engine refuses the create (a bad
    mount, say) on a host that cannot run the image, the refusal of the host is what is
    reported, as when the preflight came first."""
    from gpuenv.errors import EngineRefused, ResolutionError

    class Refusing(FakeEngine):
        def create(self, config: dict[str, object], name: str | None = None) -> str:
            raise EngineRefused(400, "invalid mount config")

    for detach in (False, True):
        with pytest.raises(ResolutionError, match="this host cannot run the locked image"):
            _launch(
                project,
                Refusing(),
                state,
                RunRequest(("train.py",), gpus="1", detach=detach),
                host=OLD_DRIVER,
            )
        assert ClaimStore(state).claims() == []


def test_a_detached_run_maps_a_cdi_refusal_at_create(
    project: Path, state: str, tmp_path: Path
) -> None:
    """As an attached run does: an engine refusing the CDI devices at create is exit 22,
    and with optional GPUs the detached run starts without them."""
    from gpuenv.errors import EngineRefused

    class NoCdi(FakeEngine):
        def create(self, config: dict[str, object], name: str | None = None) -> str:
            host_config = config.get("HostConfig") or {}
            if any(r.get("Driver") == "cdi" for r in host_config.get("DeviceRequests") or ()):  # type: ignore[union-attr]
                raise EngineRefused(500, "CDI device injection failed: unresolvable CDI devices")
            return super().create(config, name)  # type: ignore[arg-type]

    engine, environ = _cdi_engine(tmp_path)
    refusing = NoCdi(version_data=engine.version_data, info_data=engine.info_data)
    with pytest.raises(GpuPathBroken) as raised:
        _launch(
            project,
            refusing,
            state,
            RunRequest(("train.py",), gpus="1", detach=True),
            environ=environ,
        )
    assert raised.value.exit_code == 22
    assert ClaimStore(state).claims() == []
    notices: list[str] = []
    outcome = _launch(
        project,
        refusing,
        state,
        RunRequest(("train.py",), gpus="optional", detach=True),
        environ=environ,
        notices=notices,
    )
    assert outcome.container  # type: ignore[attr-defined]
    assert any("running without GPUs" in n for n in notices)
