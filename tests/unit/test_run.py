from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuenv.common.versions import DriverVersion
from gpuenv.containers.config import (
    Identity,
    command_for,
    container_config,
    environment,
    merge_accounts,
    read_env_file,
    without_gpus,
)
from gpuenv.containers.detached import attach_run
from gpuenv.containers.session import _received
from gpuenv.engine.protocol import Frame, frames
from gpuenv.errors import UsageError
from gpuenv.host.machine import Gpu, Host
from gpuenv.monitoring.monitor import RunInfo
from gpuenv.project.mounts import MountRules, spec_binds
from gpuenv.project.spec import GpuRequest
from gpuenv.project.validate import parse_spec_text
from gpuenv.reservations.gpus import Grant, grant, parse_gpus_option

from .fake_engine import FakeEngine

HOST = Host(
    DriverVersion.parse("550.54.15"),
    tuple(Gpu(i, "NVIDIA A100-SXM4-80GB", uuid=f"GPU-{i}") for i in range(4)),
    "test",
)
NO_GPUS_KNOWN = Host(None, (), "none")


@pytest.mark.parametrize(
    ("option", "host", "expected"),
    [
        ("all", HOST, Grant("all")),
        ("optional", HOST, Grant("all", optional=True)),
        ("none", HOST, Grant("none")),
        ("2", HOST, Grant("devices", ("GPU-0", "GPU-1"))),
        ("1,3", HOST, Grant("devices", ("GPU-1", "GPU-3"))),
        ("device=2", HOST, Grant("devices", ("GPU-2",))),
        ("GPU-3", HOST, Grant("devices", ("GPU-3",))),
        ("2", NO_GPUS_KNOWN, Grant("devices", ("0", "1"))),
        ("0,2", NO_GPUS_KNOWN, Grant("devices", ("0", "2"))),
    ],
)
def test_grants(option: str, host: Host, expected: Grant) -> None:
    assert grant(parse_gpus_option(option), host) == expected


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("0", "a GPU count must be at least 1"),
        ("5", "5 GPUs requested, but this host has 4"),
        ("4,1", r"GPU 4 does not exist on this host \(it has 0, 1, 2, 3\)"),
        ("GPU-9", "no GPU with UUID GPU-9 on this host"),
        ("some", "is not a GPU index"),
    ],
)
def test_bad_grants(option: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        grant(parse_gpus_option(option), HOST)


@pytest.mark.parametrize(
    ("grant_value", "visible"),
    [
        (Grant("all"), "all"),
        (Grant("none"), "void"),
        (Grant("devices", ("GPU-1", "GPU-3")), "GPU-1,GPU-3"),
    ],
)
def test_visible_devices_is_never_wider_than_the_grant(grant_value: Grant, visible: str) -> None:
    assert grant_value.visible_devices == visible


@pytest.mark.parametrize(
    ("arguments", "command"),
    [
        (("train.py", "--lr", "3e-4"), ["python3", "train.py", "--lr", "3e-4"]),
        (("bash", "-lc", "echo hi"), ["bash", "-lc", "echo hi"]),
        (("scripts/x.py",), ["python3", "scripts/x.py"]),
    ],
)
def test_commands(arguments: tuple[str, ...], command: list[str]) -> None:
    assert command_for(arguments) == command


def test_environment_precedence(tmp_path: Path) -> None:
    spec = parse_spec_text("framework: none\nenv: {A: spec, B: spec}\n", str(tmp_path))
    env_file = tmp_path / "vars.env"
    env_file.write_text("# c\n\nB=file\nC=file\nHOSTONLY\n")
    result = environment(
        spec, ["C=flag", "SECRET", "MISSING"], [str(env_file)], {"SECRET": "s", "HOSTONLY": "h"}
    )
    assert result == {"A": "spec", "B": "file", "C": "flag", "SECRET": "s", "HOSTONLY": "h"}


@pytest.mark.parametrize(
    ("line", "message"), [("1BAD=x", "is not a variable name"), ("A B=c", "is not a variable name")]
)
def test_bad_env_files(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.env"
    path.write_text(line + "\n")
    with pytest.raises(UsageError, match=message):
        read_env_file(str(path))


def test_accounts_add_the_user_once() -> None:
    me = Identity(4242, 4242, "alice")
    passwd, group = merge_accounts("root:x:0:0:root:/root:/bin/bash\n", "root:x:0:\n", me)
    assert passwd.splitlines()[-1] == "alice:x:4242:4242::/home/alice:/bin/bash"
    assert group.splitlines()[-1] == "alice:x:4242:"
    again = merge_accounts(passwd, group, me)
    assert again == (passwd, group)
    # An image that already has the uid (ubuntu:1000 on Ubuntu 24.04) keeps its entry.
    existing = merge_accounts(
        "ubuntu:x:1000:1000::/home/ubuntu:/bin/bash\n",
        "ubuntu:x:1000:\n",
        Identity(1000, 1000, "bob"),
    )
    assert "bob" not in existing[0] and "bob" not in existing[1]


def test_container_config(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    spec = parse_spec_text(
        "framework: none\nshm_size: 1g\nmounts: ['data:/data:ro']\n", str(tmp_path)
    )
    config = container_config(
        spec,
        "gpuenv/x:1",
        ["python3", "t.py"],
        Grant("devices", ("GPU-1",)),
        Identity(5, 6, "u"),
        {"K": "V"},
        {"io.gpuenv.run": "1"},
        tty=False,
        stdin=False,
        binds=spec_binds(spec, MountRules()),
    )
    host = config["HostConfig"]
    assert config["User"] == "5:6" and config["WorkingDir"] == "/workspace"
    assert {
        "K=V",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "NVIDIA_VISIBLE_DEVICES=GPU-1",
        "HOME=/home/u",
    } <= set(config["Env"])
    assert host["DeviceRequests"] == [{"DeviceIDs": ["GPU-1"], "Capabilities": [["gpu"]]}]
    assert host["ShmSize"] == 1024**3 and host["Init"] is True
    assert {"Name": "stack", "Soft": 67108864, "Hard": 67108864} in host["Ulimits"]
    assert host["Mounts"][0] == {"Type": "bind", "Source": str(tmp_path), "Target": "/workspace"}
    assert host["Mounts"][1] == {
        "Type": "bind",
        "Source": str(tmp_path / "data"),
        "Target": "/data",
        "ReadOnly": True,
    }
    assert "Privileged" not in host and host["SecurityOpt"] == ["no-new-privileges"]
    stripped = without_gpus(config)
    assert "DeviceRequests" not in stripped["HostConfig"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in stripped["Env"]


def test_ipc_host_has_no_shm_size(tmp_path: Path) -> None:
    spec = parse_spec_text("framework: none\nipc: host\n", str(tmp_path))
    host = container_config(
        spec, "x", ["true"], Grant("none"), None, {}, {}, tty=False, stdin=False
    )["HostConfig"]
    assert host["IpcMode"] == "host" and "ShmSize" not in host


class _Socket:
    """An attached stream that delivers the engine's bytes in the chunks given."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    def recv(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def test_attached_output_is_demultiplexed_across_chunks() -> None:
    """Frames split anywhere across recv()s, after bytes read ahead; an incomplete frame
    at the end is not shown."""
    sock = _Socket(
        b"\x00\x00\x00\x00\x03o", b"ut\x02\x00\x00\x00\x00\x00\x00\x03err", b"\x01\x00\x00"
    )
    ahead = b"\x01\x00\x00\x00\x00\x00\x00\x01a\x01\x00\x00"
    seen = list(frames(_received(sock, ahead), tty=False))  # type: ignore[arg-type]
    assert seen == [(1, b"a"), (1, b"out"), (2, b"err")]
    tty = list(frames(_received(_Socket(b"\x01raw"), b""), tty=True))  # type: ignore[arg-type]
    assert tty == [(1, b"\x01raw")]


def test_spec_gpus_request_default() -> None:
    assert parse_spec_text("framework: none\n", "/tmp").gpus == GpuRequest("all")


def _running(container: str) -> RunInfo:
    return RunInfo(container, "d", "proj", "alice", 1000, "0", "", "", "", "running", None, True)


def test_attach_follows_the_logs_from_now_then_gives_the_exit_code() -> None:
    """An attach to a running container can lose the bytes that came with the engine's
    answer (docker-py's attach socket does not hand them over): `gpuenv attach` follows
    the logs from their end instead, stdout and stderr kept apart."""
    engine = FakeEngine(exit_code=5, output=b"late\n", alive={"c9"})
    written: list[tuple[int, bytes]] = []
    code = attach_run(
        engine,  # type: ignore[arg-type]
        _running("c9"),
        write=lambda kind, data: written.append((kind, data)),
        notice=lambda text: None,
    )
    assert (code, written) == (5, [(1, b"late\n")])
    assert engine.calls == [("logs", ("c9", True, "0")), ("wait", ("c9",))]


def test_ctrl_c_detaches_from_a_run_and_leaves_it_running() -> None:
    class Interrupted(FakeEngine):
        def logs(self, container: str, *, follow: bool, tail: str = "all") -> Iterator[Frame]:
            yield 1, b"some\n"
            raise KeyboardInterrupt

    engine = Interrupted()
    notices: list[str] = []
    written: list[tuple[int, bytes]] = []
    code = attach_run(
        engine,  # type: ignore[arg-type]
        _running("c9"),
        write=lambda kind, data: written.append((kind, data)),
        notice=notices.append,
    )
    assert (code, written) == (None, [(1, b"some\n")])
    assert notices == ["detached from d: it goes on running (`gpuenv attach d`)"]
    assert "wait" not in engine.names()


def test_keys_typed_before_the_terminal_goes_raw_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpuenv shell`, and keys typed while the image is checked and the GPUs claimed:
    making the terminal raw must not flush them (tty.setraw's default TCSAFLUSH does)."""
    import os
    import pty
    import select

    from gpuenv.containers import session

    master, slave = pty.openpty()
    try:
        os.write(master, b"ls -la")  # typed ahead, no newline yet: in the line buffer
        monkeypatch.setattr(session.sys, "stdin", type("In", (), {"fileno": lambda self: slave})())
        with session._raw_terminal(True):
            ready, _, _ = select.select([slave], [], [], 5)
            assert ready, "the typed-ahead keys were flushed"
            assert os.read(slave, 100) == b"ls -la"
    finally:
        os.close(master)
        os.close(slave)
