"""How GPUs reach a container (containers/devices.py): CDI spec reading, the path chosen over
scripted hosts and engines, the DeviceRequests for a grant; and the engine seam's part
(which engine the environment names, Podman's libpod create body)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuenv.common.versions import DriverVersion
from gpuenv.containers.devices import (
    LEGACY,
    CdiSpec,
    EngineFacts,
    MissingCdiDevice,
    cdi_dirs,
    choose_path,
    device_requests,
    parse_cdi_spec,
    read_cdi_specs,
)
from gpuenv.engine.hosts import engine_choice
from gpuenv.engine.podman import RLIM_INFINITY, libpod_spec
from gpuenv.errors import GpuRuntimeMissing, UsageError
from gpuenv.host.machine import Gpu, Host
from gpuenv.reservations.gpus import Grant

HOST = Host(
    DriverVersion.parse("550.54.15"),
    (Gpu(0, "NVIDIA H100", uuid="GPU-a"), Gpu(1, "NVIDIA H100", uuid="GPU-b")),
)
LIB = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"
DOCKER_20 = EngineFacts("docker", "20.10.24+dfsg1", "1.41")
DOCKER_28 = EngineFacts("docker", "28.2.2", "1.50", cdi_dirs=("/etc/cdi", "/var/run/cdi"))
DOCKER_28_OFF = EngineFacts("docker", "28.2.2", "1.50", cdi_dirs=())
DOCKER_26 = EngineFacts("docker", "26.0.1", "1.45", cdi_dirs=("/etc/cdi",))
PODMAN = EngineFacts("podman", "4.3.1", "1.41")
PODMAN_ROOTLESS = EngineFacts("podman", "4.3.1", "1.41", rootless=True)


def spec(
    version: str = "0.5.0",
    names: tuple[str, ...] = ("GPU-a", "GPU-b", "all"),
    paths: tuple[str, ...] = ("/dev/nvidia0", LIB),
    renamed: tuple[tuple[str, str], ...] = (),
) -> CdiSpec:
    return CdiSpec("/etc/cdi/nvidia.yaml", version, "nvidia.com/gpu", names, paths, renamed)


def everything_exists(path: str) -> bool:
    return True


@pytest.mark.parametrize(
    ("facts", "specs", "method", "reason", "problem"),
    [
        (DOCKER_20, [spec()], "legacy", "the NVIDIA device request", None),
        (DOCKER_28, [spec()], "cdi", "CDI, 3 nvidia.com/gpu device(s)", None),
        (DOCKER_28, [], "legacy", "no usable nvidia.com/gpu CDI spec", None),
        (DOCKER_28_OFF, [spec()], "legacy", "CDI is off in this engine", None),
        (DOCKER_26, [spec("0.7.0")], "legacy", "no usable", "reads CDI specs up to 0.6.0"),
        (DOCKER_28, [spec("1.1.0")], "legacy", "no usable", "reads CDI specs up to 1.0.0"),
        (PODMAN, [spec()], "cdi", "CDI, 3", None),
        (PODMAN, [spec("0.6.0")], "cdi", "CDI, 0", "podman 4.3.1 reads CDI specs up to 0.5.0"),
        (PODMAN, [], "cdi", "CDI, 0", "no usable nvidia.com/gpu CDI spec"),
        (
            PODMAN,
            [spec(paths=("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.104.05",))],
            "cdi",
            "CDI, 0",
            "stale after a driver upgrade",
        ),
        (PODMAN, [spec(names=("GPU-a", "GPU-gone"))], "cdi", "CDI, 2", "names GPU-gone"),
        (
            PODMAN_ROOTLESS,
            [spec(renamed=(("/dev/nvidia0", "/dev/null"),))],
            "cdi",
            "CDI, 0",
            "rootless Podman binds device nodes from their own path",
        ),
        (
            PODMAN,
            [CdiSpec("/etc/cdi/broken.json", error="not valid JSON/YAML: x")],
            "cdi",
            "CDI, 0",
            "broken.json: not valid JSON/YAML",
        ),
    ],
)
def test_the_path_over_scripted_hosts(
    facts: EngineFacts, specs: list[CdiSpec], method: str, reason: str, problem: str | None
) -> None:
    exists = (lambda path: path != "/dev/nvidia0") if facts.rootless else everything_exists
    path = choose_path(facts, specs, HOST, exists=exists)
    assert path.method == method
    assert reason in path.reason
    if problem is None:
        assert path.problems == ()
    else:
        assert any(problem in p for p in path.problems), path.problems


def test_missing_host_paths_make_a_spec_unusable() -> None:
    path = choose_path(PODMAN, [spec()], HOST, exists=lambda p: p != LIB)
    assert path.names == {}
    assert "1 host path(s) it needs are missing (e.g. " + LIB in path.problems[0]


def test_forced_paths() -> None:
    assert choose_path(DOCKER_28, [spec()], HOST, "legacy", everything_exists).method == "legacy"
    forced = choose_path(DOCKER_20, [spec()], HOST, "cdi", everything_exists)
    assert forced.method == "cdi"
    assert "CDI is not enabled in Docker 20.10.24+dfsg1" in forced.problems[0]


def test_specs_that_name_gpus_by_index_are_mapped_and_said() -> None:
    path = choose_path(PODMAN, [spec(names=("0", "1"))], HOST, exists=everything_exists)
    assert path.names == {"GPU-a": "nvidia.com/gpu=0", "GPU-b": "nvidia.com/gpu=1"}
    assert path.all_device is None
    assert "names GPU 0 by index" in path.notes[0]


def test_a_remote_dockers_own_device_listing() -> None:
    facts = EngineFacts(
        "docker", "28.3.0", "1.50", cdi_dirs=("/etc/cdi",), cdi_devices=("nvidia.com/gpu=GPU-b",)
    )
    path = choose_path(facts, [], HOST)
    assert path.method == "cdi"
    assert path.names == {"GPU-b": "nvidia.com/gpu=GPU-b"}


@pytest.mark.parametrize(
    ("grant", "expected"),
    [
        (Grant("all"), [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}]),
        (Grant("devices", ("GPU-b",)), [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=GPU-b"]}]),
        (Grant("none"), []),
    ],
)
def test_cdi_requests(grant: Grant, expected: list[dict[str, Any]]) -> None:
    path = choose_path(PODMAN, [spec()], HOST, exists=everything_exists)
    assert device_requests(path, grant) == expected


def test_legacy_requests_and_missing_cdi_devices() -> None:
    assert device_requests(LEGACY, Grant("all")) == [{"Count": -1, "Capabilities": [["gpu"]]}]
    assert device_requests(LEGACY, Grant("devices", ("0",))) == [
        {"DeviceIDs": ["0"], "Capabilities": [["gpu"]]}
    ]
    path = choose_path(PODMAN, [spec(names=("GPU-a",))], HOST, exists=everything_exists)
    # Without an "all" device, every GPU the specs name.
    assert device_requests(path, Grant("all"))[0]["DeviceIDs"] == ["nvidia.com/gpu=GPU-a"]
    with pytest.raises(MissingCdiDevice, match="GPU-b"):
        device_requests(path, Grant("devices", ("GPU-b",)))
    empty = choose_path(PODMAN, [], HOST)
    with pytest.raises(MissingCdiDevice):
        device_requests(empty, Grant("all"))


def test_reading_spec_files(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(
        json.dumps(
            {
                "cdiVersion": "0.5.0",
                "kind": "nvidia.com/gpu",
                "devices": [
                    {
                        "name": "GPU-a",
                        "containerEdits": {
                            "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]
                        },
                    }
                ],
                "containerEdits": {"mounts": [{"hostPath": LIB, "containerPath": LIB}]},
            }
        )
    )
    (tmp_path / "b.yaml").write_text(
        "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n  containerEdits: {}\n"
    )
    (tmp_path / "c.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "notes.txt").write_text("not a spec")
    a, b, c = read_cdi_specs([str(tmp_path), str(tmp_path / "missing")])
    assert (a.version, a.devices, a.host_paths) == ("0.5.0", ("GPU-a",), (LIB, "/dev/null"))
    assert a.renamed_nodes == (("/dev/nvidia0", "/dev/null"),)
    assert (b.version, b.devices) == ("0.6.0", ("all",))
    assert c.error is not None and "not valid YAML" in c.error
    assert parse_cdi_spec("x.json", "{}").error == "not a CDI spec (no cdiVersion or kind)"


def test_where_specs_are_read() -> None:
    assert cdi_dirs({"GPUENV_CDI_SPEC_DIRS": "/a:/b"}, ["/etc/cdi"]) == ("/a", "/b")
    assert cdi_dirs({}, ["/srv/cdi"]) == ("/srv/cdi",)
    assert cdi_dirs({}, None) == ("/etc/cdi", "/var/run/cdi")


def test_engine_facts() -> None:
    rootless = EngineFacts.from_engine(
        {"Version": "28.2.2", "ApiVersion": "1.50"},
        {
            "SecurityOptions": ["name=seccomp,profile=builtin", "name=rootless", "name=cgroupns"],
            "CDISpecDirs": ["/etc/cdi"],
            "DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}],
        },
    )
    assert rootless.rootless and rootless.cdi_enabled
    assert rootless.cdi_devices == ("nvidia.com/gpu=0",)
    assert rootless.reads_cdi_up_to == "1.0.0"
    podman = EngineFacts.from_engine(
        {
            "Version": "4.3.1",
            "ApiVersion": "1.41",
            "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}],
        },
        {},
    )
    assert (podman.product, podman.reads_cdi_up_to, podman.cdi_enabled) == ("podman", "0.5.0", True)
    assert not podman.rootless
    # Podman's adapter says rootless in its version (from the socket's owner).
    assert EngineFacts.from_engine(
        {"Version": "4.3.1", "Rootless": True, "Components": [{"Name": "Podman Engine"}]}, {}
    ).rootless
    old = EngineFacts.from_engine({"Version": "24.0.7", "ApiVersion": "1.43"}, {})
    assert (old.cdi_enabled, old.reads_cdi_up_to) == (False, None)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, ("docker", "unix:///var/run/docker.sock")),
        ({"DOCKER_HOST": "tcp://gpu1:2376"}, ("docker", "tcp://gpu1:2376")),
        (
            {"DOCKER_HOST": "unix:///run/podman/podman.sock"},
            ("podman", "unix:///run/podman/podman.sock"),
        ),
        (
            {"CONTAINER_HOST": "unix:///run/user/7/podman/podman.sock"},
            ("podman", "unix:///run/user/7/podman/podman.sock"),
        ),
        (
            {"GPUENV_ENGINE": "podman", "DOCKER_HOST": "unix:///srv/engine.sock"},
            ("podman", "unix:///srv/engine.sock"),
        ),
        (
            {"GPUENV_ENGINE": "docker", "CONTAINER_HOST": "unix:///x/podman.sock"},
            ("docker", "unix:///var/run/docker.sock"),
        ),
    ],
)
def test_which_engine_the_environment_names(env: dict[str, str], expected: tuple[str, str]) -> None:
    assert engine_choice(env) == expected


def test_an_unknown_engine_name() -> None:
    with pytest.raises(UsageError, match="GPUENV_ENGINE=lxc"):
        engine_choice({"GPUENV_ENGINE": "lxc"})


CREATE = {
    "Image": "gpuenv/p:1",
    "Cmd": ["python3", "train.py"],
    "WorkingDir": "/workspace",
    "User": "1000:1000",
    "Env": ["A=1", "NVIDIA_VISIBLE_DEVICES=GPU-a"],
    "Tty": False,
    "OpenStdin": True,
    "Labels": {"io.gpuenv.run": "1"},
    "HostConfig": {
        "Mounts": [
            {"Type": "bind", "Source": "/p", "Target": "/workspace"},
            {"Type": "bind", "Source": "/d", "Target": "/data", "ReadOnly": True},
        ],
        "Init": True,
        "Ulimits": [
            {"Name": "memlock", "Soft": -1, "Hard": -1},
            {"Name": "stack", "Soft": 67108864, "Hard": 67108864},
        ],
        "SecurityOpt": ["no-new-privileges"],
        "ShmSize": 268435456,
        "Memory": 1073741824,
        "DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=GPU-a"]}],
    },
}


def test_podmans_create_body() -> None:
    body = libpod_spec(CREATE, rootless=True)
    assert body["image"] == "gpuenv/p:1" and body["command"] == ["python3", "train.py"]
    assert body["env"] == {"A": "1", "NVIDIA_VISIBLE_DEVICES": "GPU-a"}
    assert body["devices"] == [{"path": "nvidia.com/gpu=GPU-a"}]
    assert body["userns"] == {"nsmode": "keep-id"}  # files in the project stay the user's
    assert body["mounts"][1] == {
        "destination": "/data",
        "source": "/d",
        "type": "bind",
        "options": ["rbind", "ro"],
    }
    limits = {limit["type"]: limit for limit in body["r_limits"]}
    assert limits["memlock"]["hard"] == RLIM_INFINITY
    assert {"nofile", "nproc"} <= set(limits)  # named, or rootful Podman sets 1048576
    assert (body["init"], body["no_new_privileges"], body["stdin"]) == (True, True, True)
    assert body["resource_limits"] == {"memory": {"limit": 1073741824}}
    assert body["shm_size"] == 268435456
    rootful = libpod_spec(CREATE, rootless=False)
    assert "userns" not in rootful
    as_root = libpod_spec({**CREATE, "User": "0:0"}, rootless=True)
    assert "userns" not in as_root


@pytest.mark.parametrize(
    ("service", "expected"),
    [
        # a service that can raise its limits (root with CAP_SYS_RESOURCE): left to
        # choose nofile and nproc itself (rootful Podman: 1048576)
        ({}, {"memlock": RLIM_INFINITY, "stack": 67108864}),
        # one that cannot: nothing above its own hard limits is asked for
        (
            {"nofile": 20000, "nproc": 4096, "memlock": 65536, "stack": RLIM_INFINITY},
            {"memlock": 65536, "stack": 67108864, "nofile": 20000, "nproc": 4096},
        ),
        # limits above Podman's own default are named at that default
        (
            {"nofile": 2**30, "nproc": RLIM_INFINITY, "memlock": RLIM_INFINITY},
            {"memlock": RLIM_INFINITY, "stack": 67108864, "nofile": 1048576, "nproc": 1048576},
        ),
    ],
)
def test_podman_asks_for_no_rlimit_the_service_cannot_grant(
    service: dict[str, int], expected: dict[str, int]
) -> None:
    body = libpod_spec(CREATE, rootless=False, limits=service)
    hard = {limit["type"]: limit["hard"] for limit in body["r_limits"]}
    assert hard == expected
    assert all(limit["soft"] <= limit["hard"] for limit in body["r_limits"])


def test_the_services_limits_are_read_from_the_process_that_serves(tmp_path: Path) -> None:
    """The peer of a unix socket this process serves is this process: its limits (or {}
    where it may raise them), as /proc says."""
    import resource
    import socket

    from gpuenv.engine.podman import service_limits

    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        limits = service_limits(path)
    assert limits is not None
    status = Path("/proc/self/status").read_text()
    effective = int(status.split("CapEff:")[1].split()[0], 16)
    if os.getuid() == 0 and effective >> 24 & 1:
        assert limits == {}
    else:
        _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
        assert limits["nproc"] == (RLIM_INFINITY if nproc == resource.RLIM_INFINITY else nproc)
    assert service_limits(str(tmp_path / "none.sock")) is None  # nobody serves it


def test_podman_refuses_the_legacy_request() -> None:
    legacy = {
        **CREATE,
        "HostConfig": {"DeviceRequests": [{"Count": -1, "Capabilities": [["gpu"]]}]},
    }
    with pytest.raises(GpuRuntimeMissing, match="only through CDI"):
        libpod_spec(legacy, rootless=False)


def test_connect_picks_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuenv.engine.connection import connect
    from gpuenv.engine.dockerpy import DockerEngine
    from gpuenv.engine.podman import PodmanEngine
    from gpuenv.errors import EngineError

    for name in ("DOCKER_HOST", "CONTAINER_HOST", "GPUENV_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CONTAINER_HOST", "unix:///run/user/7/podman/podman.sock")
    engine = connect()
    assert isinstance(engine, PodmanEngine)
    assert engine.endpoint == "unix:///run/user/7/podman/podman.sock"
    monkeypatch.setenv("GPUENV_ENGINE", "docker")
    docker = connect()
    assert type(docker) is DockerEngine
    assert docker.endpoint == "unix:///var/run/docker.sock"
    assert type(connect("tcp://gpu1:2376")) is DockerEngine
    monkeypatch.setenv("GPUENV_ENGINE", "podman")
    monkeypatch.setenv("CONTAINER_HOST", "ssh://gpu1/run/podman/podman.sock")
    with pytest.raises(EngineError, match="only on a unix:// socket"):
        connect()


def test_an_unreachable_podman_says_how_to_start_it(tmp_path: Path) -> None:
    from gpuenv.engine.podman import PodmanEngine
    from gpuenv.errors import EngineError

    engine = PodmanEngine(f"unix://{tmp_path}/podman.sock")
    with pytest.raises(EngineError) as raised:
        engine.version()
    assert "cannot reach the Podman service" in raised.value.message
    assert "podman.socket" in (raised.value.hint or "")


def test_published_ports_reach_podman_as_libpod_port_mappings() -> None:
    """Podman's libpod API takes ports as `portmappings`, not the Engine API's
    PortBindings: without them a published port was silently not published on Podman."""
    from gpuenv.project.ports import Port, engine_ports

    exposed, bindings = engine_ports(
        (Port(8000), Port(6006, 9000, "0.0.0.0"), Port(53, protocol="udp"))
    )
    spec = libpod_spec(
        {"Image": "x", "ExposedPorts": exposed, "HostConfig": {"PortBindings": bindings}},
        rootless=False,
    )
    assert sorted(spec["portmappings"], key=lambda m: m["container_port"]) == [
        {"container_port": 53, "host_port": 0, "host_ip": "127.0.0.1", "protocol": "udp"},
        {"container_port": 6006, "host_port": 9000, "host_ip": "0.0.0.0", "protocol": "tcp"},
        {"container_port": 8000, "host_port": 0, "host_ip": "127.0.0.1", "protocol": "tcp"},
    ]
    assert "portmappings" not in libpod_spec({"Image": "x"}, rootless=False)
