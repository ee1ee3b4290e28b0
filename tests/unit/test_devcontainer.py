"""`gpuenv export devcontainer` (issue 34, item 3), the parts that need no engine: the
file as data, read back as the Dev Containers tools read it (comments, trailing commas),
its staleness against the lock, and the keeper that holds an editor container's claims
by name, across a rebuild. The whole path with the real tools:
tests/integration/test_devcontainer.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuenv.app.check import check_project
from gpuenv.app.keeper import follow_named, keep_named
from gpuenv.containers.devcontainer import (
    EditorContainer,
    NotOurs,
    container_name,
    devcontainer_config,
    gpu_run_args,
    read_written,
    render,
    stale_devcontainer,
    strip_jsonc,
)
from gpuenv.errors import EngineRefused, LockError
from gpuenv.images.accounts import Identity
from gpuenv.project.mounts import Bind
from gpuenv.project.ports import Port
from gpuenv.project.spec import WORKSPACE, Spec
from gpuenv.reservations.claims import ClaimStore
from tests.unit.fake_engine import FakeEngine

UUID = "GPU-00000000-1111-4000-8000-000000000000"


def _spec(tmp_path: Path, **fields: Any) -> Spec:
    return Spec(project_dir=str(tmp_path), name="demo", framework="pytorch", **fields)


def _editor(tmp_path: Path, **changes: Any) -> EditorContainer:
    fields: dict[str, Any] = {
        "spec": _spec(tmp_path),
        "image": "gpuenv/demo:0123-u1000",
        "lock_hash": "sha256:ab",
        "name": "demo-dev-1000-abcdef",
        "host": "gpu1",
        "identity": Identity(1000, 100, "alice"),
        "gpus": (UUID,),
        "gpu_args": ("--gpus", f'"device={UUID}"'),
        "visible_devices": UUID,
        "grant": UUID,
        "shm_size": 1024,
        "memlock": -1,
        "claim_command": ("/venv/bin/python", "-m", "gpuenv.cli", "devcontainer-claim"),
    }
    return EditorContainer(**{**fields, **changes})


@pytest.mark.parametrize(
    ("requests", "args"),
    [
        ([], ()),
        ([{"DeviceIDs": [UUID], "Capabilities": [["gpu"]]}], ("--gpus", f'"device={UUID}"')),
        ([{"DeviceIDs": ["0", "2"], "Capabilities": [["gpu"]]}], ("--gpus", '"device=0,2"')),
        ([{"Count": -1, "Capabilities": [["gpu"]]}], ("--gpus", "all")),
        ([{"Count": 2, "Capabilities": [["gpu"]]}], ("--gpus", "2")),
        (
            [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]}],
            ("--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"),
        ),
    ],
)
def test_gpu_requests_become_the_docker_run_options(
    requests: list[dict[str, Any]], args: tuple[str, ...]
) -> None:
    assert gpu_run_args(requests) == args


def test_the_file_says_what_a_run_would_be(tmp_path: Path) -> None:
    editor = _editor(
        tmp_path,
        spec=_spec(tmp_path, ipc="host", env=(("WANDB_MODE", "offline"),)),
        binds=(Bind("/data/sets", "/data", True),),
        ports=(Port(8888), Port(6006), Port(5000, protocol="udp")),
    )
    config = devcontainer_config(editor)
    assert config["image"] == "gpuenv/demo:0123-u1000"
    assert config["workspaceFolder"] == WORKSPACE
    assert config["workspaceMount"].startswith("source=${localWorkspaceFolder},target=/workspace")
    assert config["containerUser"] == "1000:100" and config["updateRemoteUserUID"] is False
    assert config["init"] is True
    env = config["containerEnv"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == UUID and env["WANDB_MODE"] == "offline"
    assert env["HOME"] == "/home/alice" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert config["mounts"] == ["source=/data/sets,target=/data,type=bind,readonly"]
    args = config["runArgs"]
    assert args[:4] == ["--name", "demo-dev-1000-abcdef", "--gpus", f'"device={UUID}"']
    for option, value in [
        ("--ipc", "host"),
        ("--shm-size", "1024"),
        ("--security-opt", "no-new-privileges"),
    ]:
        assert args[args.index(option) + 1] == value
    assert "memlock=-1:-1" in args and "stack=67108864:67108864" in args
    labels = [args[i + 1] for i, arg in enumerate(args) if arg == "--label"]
    assert "io.gpuenv.run=1" in labels and "io.gpuenv.detached=1" in labels
    assert "io.gpuenv.command=devcontainer" in labels and "io.gpuenv.user=alice (1000)" in labels
    assert config["forwardPorts"] == [6006, 8888]  # tcp ones: editors forward those
    assert config["initializeCommand"][-1] == "devcontainer-claim"
    assert config["customizations"]["gpuenv"] == {
        "lock": "sha256:ab",
        "container": "demo-dev-1000-abcdef",
        "gpus": [UUID],
        "uid": 1000,
        "host": "gpu1",
    }


def test_as_root_there_is_no_user_and_without_gpus_nothing_to_claim(tmp_path: Path) -> None:
    editor = _editor(
        tmp_path, identity=None, gpus=(), gpu_args=(), visible_devices="void", grant="none"
    )
    config = devcontainer_config(editor)
    assert "containerUser" not in config and "HOME" not in config["containerEnv"]
    assert "--gpus" not in config["runArgs"]
    assert config["containerEnv"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert config["customizations"]["gpuenv"]["gpus"] == []
    assert config["customizations"]["gpuenv"]["uid"] == 0


def test_the_file_reads_back_as_the_tools_read_it(tmp_path: Path) -> None:
    text = render(devcontainer_config(_editor(tmp_path)), "alice")
    assert text.startswith("// Written by `gpuenv export devcontainer`")
    written = read_written(text)
    assert written.gpus == (UUID,) and written.container == "demo-dev-1000-abcdef"
    assert written.lock == "sha256:ab" and written.uid == 1000 and written.host == "gpu1"
    # Edited as people edit JSONC: a comment, a trailing comma, // inside a string.
    edited = text.replace('"init": true,', '"init": true, // tini\n "x": "a//b",')
    edited = edited.rstrip().removesuffix("}").rstrip() + ",\n}\n"  # a trailing comma
    assert edited.rstrip().endswith("},\n}")
    assert read_written(edited).gpus == (UUID,)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"image": "mine"}', "gpuenv did not write it"),
        ("[1, 2]", "gpuenv did not write it"),
        ('{"customizations": []}', "gpuenv did not write it"),
        ('{"customizations": {"gpuenv": "x"}}', "gpuenv did not write it"),
        ("[" * 5000 + "]" * 5000, "nested more than"),
        ("{nope", "not JSON"),
        ('{"customizations": {"gpuenv": {"lock": 1}}}', "not as gpuenv wrote it"),
        (
            '{"customizations": {"gpuenv": {"lock": "a", "container": "c", "gpus": [1],'
            ' "uid": 0, "host": "h"}}}',
            "not as gpuenv wrote it",
        ),
    ],
)
def test_a_file_gpuenv_did_not_write_is_said_so(text: str, why: str) -> None:
    with pytest.raises(NotOurs, match=why):
        read_written(text)


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ('{"a": 1, /* x */ "b": [1,]}', '{"a": 1,  "b": [1]}'),
        ('{"a": "say \\"//\\" here"} // end', '{"a": "say \\"//\\" here"} '),
        ('{"a": [1, 2, // two\n ], }', '{"a": [1, 2 \n ] }'),
        ('{"a": "/* not a comment */"}', '{"a": "/* not a comment */"}'),
    ],
)
def test_jsonc_is_made_plain_json(text: str, plain: str) -> None:
    assert strip_jsonc(text) == plain
    json.loads(plain)


def test_the_container_name_is_the_users_and_the_folders() -> None:
    one = container_name("demo", "/home/alice/demo", 1000)
    assert one == container_name("demo", "/home/alice/demo", 1000)
    assert one != container_name("demo", "/home/alice/demo-2", 1000)
    assert one != container_name("demo", "/home/alice/demo", 1001)


def test_a_file_written_from_another_lock_is_stale(tmp_path: Path) -> None:
    from gpuenv.common.files import file_hash

    assert stale_devcontainer(str(tmp_path)) is None  # none written: nothing to say
    lock = tmp_path / "gpuenv.lock"
    lock.write_text("lock: 1\n")
    folder = tmp_path / ".devcontainer"
    folder.mkdir()
    editor = _editor(tmp_path, lock_hash=file_hash(str(lock)))
    (folder / "devcontainer.json").write_text(render(devcontainer_config(editor), "alice"))
    assert stale_devcontainer(str(tmp_path)) is None
    lock.write_text("lock: 2\n")
    assert "written from another gpuenv.lock" in str(stale_devcontainer(str(tmp_path)))
    (folder / "devcontainer.json").write_text('{"image": "mine"}')  # the user's own
    assert stale_devcontainer(str(tmp_path)) is None


def test_check_and_lock_check_report_a_stale_devcontainer(tmp_path: Path, matrix: Any) -> None:
    from gpuenv.app.lock import verify_lock
    from gpuenv.common.files import file_hash
    from tests.unit.test_lock import locked

    (tmp_path / "gpuenv.yaml").write_text("name: demo\nframework: pytorch\nversion: '2.4'\n")
    lock = locked(tmp_path, matrix)
    folder = tmp_path / ".devcontainer"
    folder.mkdir()
    current = _editor(tmp_path, lock_hash=file_hash(str(lock)))
    (folder / "devcontainer.json").write_text(render(devcontainer_config(current), "alice"))
    assert not [i for i in check_project(str(tmp_path), {}).items if i.subject == "devcontainer"]
    verify_lock(str(tmp_path))
    stale = _editor(tmp_path, lock_hash="sha256:old")
    (folder / "devcontainer.json").write_text(render(devcontainer_config(stale), "alice"))
    report = check_project(str(tmp_path), {})
    (item,) = [i for i in report.items if i.subject == "devcontainer"]
    assert isinstance(item.error, LockError)
    assert "gpuenv export devcontainer" in str(item.error.hint)
    assert report.exit_code == LockError.exit_code
    with pytest.raises(LockError, match=r"devcontainer\.json: it was written from another"):
        verify_lock(str(tmp_path))


class Named(FakeEngine):
    """An engine where the containers called by one name come and go as the test says:
    `inspect` tells whether one runs and with which GPUs (its `io.gpuenv.gpus` label),
    `wait` blocks until the test ends it."""

    def __init__(self) -> None:
        super().__init__()
        self.running = threading.Event()
        self.exit_codes = [0]
        self.gpus = UUID

    def inspect(self, container: str) -> dict[str, Any]:
        if not self.running.is_set():
            raise EngineRefused(404, f"No such container: {container}")
        return {"State": {"Running": True}, "Config": {"Labels": {"io.gpuenv.gpus": self.gpus}}}

    def wait(self, container: str) -> int:
        while self.running.is_set():
            time.sleep(0.01)
        return self.exit_codes[-1]


def test_an_editor_container_that_never_runs_frees_its_claims() -> None:
    started = time.monotonic()
    assert follow_named(Named(), "demo-dev", patience=0.2, grace=5, poll=0.01) is None
    assert time.monotonic() - started < 5


def test_claims_are_held_across_a_rebuild_and_freed_after_the_grace(tmp_path: Path) -> None:
    store = ClaimStore(str(tmp_path / "state"))
    with store.locked():
        handed = store.transfer(store.add([UUID], "demo"), "demo-dev", "demo-dev")
    engine = Named()
    kept: list[int | None] = []
    keeper = threading.Thread(
        target=lambda: kept.append(
            keep_named(engine, "demo-dev", store, handed, patience=5, grace=0.5, poll=0.01)
        )
    )
    keeper.start()
    other = ClaimStore(str(tmp_path / "state"))
    time.sleep(0.2)
    assert [c.run for c in other.claims()] == ["demo-dev"]  # before the editor starts it
    engine.running.set()
    time.sleep(0.2)
    engine.running.clear()  # a rebuild removes it ...
    time.sleep(0.1)
    engine.exit_codes.append(7)
    engine.running.set()  # ... and makes it again, within the grace
    time.sleep(0.7)
    assert [c.run for c in other.claims()] == ["demo-dev"]
    engine.running.clear()  # the editor closes: freed after the grace
    keeper.join(10)
    assert kept == [7] and other.claims() == []


def test_a_container_rebuilt_with_other_gpus_frees_the_old_ones_after_the_grace(
    tmp_path: Path,
) -> None:
    """Exported again (other GPUs) and rebuilt: the container of that name now runs with
    GPUs the old keeper does not hold, which is not its container; it lets go of its
    GPU when the grace ends, though a container of the name runs."""
    store = ClaimStore(str(tmp_path / "state"))
    with store.locked():
        handed = store.transfer(store.add([UUID], "demo"), "demo-dev", "demo-dev")
    engine = Named()
    engine.running.set()
    kept: list[int | None] = []
    keeper = threading.Thread(
        target=lambda: kept.append(
            keep_named(engine, "demo-dev", store, handed, patience=5, grace=1.0, poll=0.01)
        )
    )
    keeper.start()
    other = ClaimStore(str(tmp_path / "state"))
    time.sleep(0.2)
    assert [c.gpu for c in other.claims()] == [UUID]  # its container runs with it
    engine.running.clear()  # the rebuild removes it ...
    time.sleep(0.2)  # (the keeper sees it gone) well within the grace
    engine.gpus = "GPU-other"
    engine.running.set()  # ... and makes it with the new export's GPU
    keeper.join(10)
    assert not keeper.is_alive() and kept == [0]
    assert other.claims() == []  # freed while the rebuilt container runs
    engine.running.clear()
