"""GPU-hours records against other local users (gpuenv/monitoring/usage_files.py): forged
names, owners and fields, planted markers, FIFOs and links; and detached runs' ends.
Tests run as root: other users' files are made with os.chown."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuenv.errors import StateUnsafe, UsageError
from gpuenv.monitoring.usage import UsageLog, summarize
from tests.unit.test_usage import A100, HOUR, NOW, _write

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="makes files of other users")
ALICE, BOB = 1000, 1001


def start(uid: int = ALICE, run_id: str = "a1", **extra: Any) -> dict[str, Any]:
    record = {
        "event": "start",
        "id": run_id,
        "user": "alice",
        "uid": uid,
        "project": "llm",
        "start": NOW - HOUR,
        "gpus": [{"key": "GPU-0", "model": A100}],
        "host": "elsewhere",  # another host: running until its end is recorded
    }
    return record | extra


def end(run_id: str = "a1", at: float = NOW - HOUR + 60) -> dict[str, Any]:
    return {"event": "end", "id": run_id, "end": at, "exit": 0}


@pytest.fixture
def no_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened without O_NONBLOCK) fails the test, not hangs."""

    def alarm(_number: int, _frame: object) -> None:
        raise TimeoutError("blocked reading a usage file")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _forged_name(state: Path) -> None:
    for name in ("evil.jsonl", "01000.jsonl", "1000.x.jsonl", "1000.jsonl.bak", "+1000.jsonl"):
        _write(state, ALICE, [start()], name=name)


def _foreign_owner(state: Path) -> None:
    _write(state, BOB, [start()], name=f"{ALICE}.jsonl")  # bob's file named as alice's


def _other_uid_inside(state: Path) -> None:
    _write(state, BOB, [start(uid=ALICE)])  # bob writes a record claiming alice's uid


def _symlinked_file(state: Path) -> None:
    real = _write(state, ALICE, [start()], name="real")
    (state / "usage" / f"{ALICE}.jsonl").symlink_to(real)


def _fifo_file(state: Path) -> None:
    (state / "usage").mkdir(mode=0o1777)
    os.mkfifo(state / "usage" / f"{ALICE}.jsonl")
    os.chown(state / "usage" / f"{ALICE}.jsonl", ALICE, ALICE)


@pytest.mark.parametrize(
    "plant",
    [_forged_name, _foreign_owner, _other_uid_inside, _symlinked_file, _fifo_file],
    ids=["forged-name", "foreign-owner", "other-uid-inside", "symlink", "fifo"],
)
def test_roots_report_believes_only_each_users_own_file(
    tmp_path: Path, plant: Callable[[Path], None], no_hang: None
) -> None:
    plant(tmp_path)
    assert UsageLog(str(tmp_path)).runs(uid=0) == []


def test_a_forged_user_name_is_the_owners_name(tmp_path: Path) -> None:
    _write(tmp_path, ALICE, [start(user="root")])
    (run,) = UsageLog(str(tmp_path)).runs(uid=0)
    assert (run.uid, run.state) == (ALICE, "running") and run.user != "root"


def test_another_users_end_record_ends_nothing(tmp_path: Path) -> None:
    _write(tmp_path, ALICE, [start()])
    _write(tmp_path, BOB, [end()])  # bob's file: an end of alice's run id
    (run,) = UsageLog(str(tmp_path)).runs(uid=0)
    assert (run.state, run.end) == ("running", None)


@pytest.mark.parametrize(
    ("owner", "believed"), [(BOB, False), (ALICE, True), (0, True)], ids=["bob", "alice", "root"]
)
def test_end_markers_count_only_from_root_or_the_owner(
    tmp_path: Path, owner: int, believed: bool
) -> None:
    _write(tmp_path, ALICE, [start()])
    ended = tmp_path / "usage" / "ended"
    ended.mkdir(mode=0o1777)
    ended.chmod(0o1777)
    marker = ended / "a1.json"
    marker.write_text(json.dumps({"id": "a1", "end": NOW - HOUR + 1, "exit": 9}))
    os.chown(marker, owner, owner)
    (run,) = UsageLog(str(tmp_path)).runs(uid=0)
    assert (run.state == "ended") is believed
    assert run.exit == (9 if believed else None)


def test_a_fifo_marker_does_not_block_the_report(tmp_path: Path, no_hang: None) -> None:
    _write(tmp_path, ALICE, [start()])
    (tmp_path / "usage" / "ended").mkdir(mode=0o1777)
    os.mkfifo(tmp_path / "usage" / "ended" / "a1.json")
    (run,) = UsageLog(str(tmp_path)).runs(uid=0)
    assert run.state == "running"


@pytest.mark.parametrize(
    "fields",
    [
        {"uid": "x"},
        {"uid": True},
        {"start": "x"},
        {"start": True},
        {"start": float("nan")},
        {"gpus": "GPU-0"},
        {"gpus": [1]},
        {"project": 5},
        {"id": "../../etc"},
        {"id": 7},
    ],
    ids=repr,
)
def test_malformed_start_records_are_skipped(tmp_path: Path, fields: dict[str, Any]) -> None:
    _write(tmp_path, ALICE, [start(**fields), start(run_id="good")])
    assert [r.id for r in UsageLog(str(tmp_path)).runs(uid=0)] == ["good"]


@pytest.mark.parametrize(
    ("fields", "state", "exit_code"),
    [
        ({"pid": "x", "host": socket.gethostname()}, "unrecorded", None),
        ({"pid": True, "host": socket.gethostname()}, "unrecorded", None),
    ],
)
def test_malformed_pids_are_not_running(
    tmp_path: Path, fields: dict[str, Any], state: str, exit_code: int | None
) -> None:
    _write(tmp_path, ALICE, [start(**fields)])
    (run,) = UsageLog(str(tmp_path)).runs(uid=0)
    assert (run.state, run.exit) == (state, exit_code)


@pytest.mark.parametrize(
    ("record", "state", "exit_code"),
    [
        ({"event": "end", "id": "a1", "end": "soon"}, "running", None),
        ({"event": "end", "id": "a1", "end": True}, "running", None),
        ({"event": "end", "id": "a1", "end": NOW, "exit": "x"}, "ended", None),
        ({"event": "end", "id": "a1", "end": NOW, "exit": 3}, "ended", 3),
    ],
)
def test_malformed_end_records(
    tmp_path: Path, record: dict[str, Any], state: str, exit_code: int | None
) -> None:
    _write(tmp_path, ALICE, [start(), record])
    (run,) = UsageLog(str(tmp_path)).runs(uid=0)
    assert (run.state, run.exit) == (state, exit_code)


def test_the_usage_command_survives_malformed_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from gpuenv.cli.tree import main

    _write(tmp_path, 0, [{"event": "start", "id": "x", "uid": "x"}, start(uid=0, start="y")])
    monkeypatch.setenv("GPUENV_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUENV_HOST_CONFIG", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("{}\n")
    result = CliRunner().invoke(main, ["usage", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"] == []


def _symlinked_dir(state: Path) -> None:
    (state / "elsewhere").mkdir()
    (state / "usage").symlink_to(state / "elsewhere")


def _foreign_dir(state: Path) -> None:
    (state / "usage").mkdir(mode=0o1777)
    os.chown(state / "usage", ALICE, ALICE)  # whoever made it first could delete records


def _not_sticky(state: Path) -> None:
    (state / "usage").mkdir()
    (state / "usage").chmod(0o777)


@pytest.mark.parametrize(
    "plant", [_symlinked_dir, _foreign_dir, _not_sticky], ids=["symlink", "foreign", "not-sticky"]
)
def test_an_unsafe_usage_folder_is_refused(tmp_path: Path, plant: Callable[[Path], None]) -> None:
    plant(tmp_path)
    log = UsageLog(str(tmp_path))
    with pytest.raises(StateUnsafe, match="usage"):
        log.begin("llm", [])
    with pytest.raises(StateUnsafe, match="usage"):
        log.finish_for(f"{ALICE}/abc123", 0)
    with pytest.raises(StateUnsafe, match="usage"):
        log.runs()
    assert not (tmp_path / "elsewhere").exists() or list((tmp_path / "elsewhere").iterdir()) == []


def test_root_refuses_a_hard_linked_or_foreign_file(tmp_path: Path) -> None:
    path = _write(tmp_path, ALICE, [start()])
    os.link(path, tmp_path / "alias")
    with pytest.raises(UsageError, match="not uid 1000's usage file"):
        UsageLog(str(tmp_path)).finish_for(f"{ALICE}/a1", 0, end=NOW)
    os.unlink(tmp_path / "alias")
    os.chown(path, BOB, BOB)
    with pytest.raises(UsageError, match="not uid 1000's usage file"):
        UsageLog(str(tmp_path)).finish_for(f"{ALICE}/a1", 0, end=NOW)


def test_a_detached_run_counts_until_its_end_is_recorded(tmp_path: Path) -> None:
    here = {"host": socket.gethostname(), "pid": 1, "pid_start": "0"}  # its gpuenv exited
    _write(tmp_path, ALICE, [start(**here, detached=True), start(run_id="b2", **here)])
    runs = {r.id: r for r in UsageLog(str(tmp_path)).runs(uid=0)}
    assert (runs["a1"].state, runs["b2"].state) == ("running", "unrecorded")
    (row,) = summarize(list(runs.values()), "user", 0, NOW)
    assert row.runs == 1 and row.gpu_hours == pytest.approx(1.0)


def _detached(tmp_path: Path) -> tuple[Any, str, str]:
    """`gpuenv run -d` against the fake engine, recording its usage."""
    from gpuenv.app.launch import RunRequest, Services, Terminal, launch
    from gpuenv.reservations.claims import ClaimStore
    from tests.unit.fake_engine import FakeEngine
    from tests.unit.test_launch import ALICE as IDENTITY
    from tests.unit.test_launch import HOST, _NullView, project

    folder = project.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    state = str(tmp_path / "state")
    engine = FakeEngine(exit_code=5, finished_at="2026-12-01T10:00:00.123456789Z")
    launch(
        str(folder),
        RunRequest(("train.py",), gpus="1", detach=True, name="dd"),
        engine,  # type: ignore[arg-type]
        services=Services(
            lambda: HOST,
            lambda: ClaimStore(state),
            lambda: IDENTITY,
            usage_log=lambda: UsageLog(state),
        ),
        terminal=Terminal(uid=1000),
        environ={},
        view=lambda: _NullView(),  # type: ignore[arg-type,return-value]
        notice=lambda _text: None,
    )
    label = engine.created[0]["Labels"]["io.gpuenv.usage"]
    return engine, state, label


FINISHED = 1796119200.0  # 2026-12-01T10:00:00Z


def test_a_detached_runs_end_comes_from_the_reaper_once(tmp_path: Path) -> None:
    from gpuenv.app.launch import reap

    engine, state, label = _detached(tmp_path)
    (run,) = UsageLog(state).runs()
    assert run.state == "running" and label.endswith(run.id)
    path = Path(state) / "usage" / f"{os.getuid()}.jsonl"
    assert json.loads(path.read_text())["detached"] is True
    engine.exit("c1")
    engine.listed = [
        {
            "Id": "c1",
            "State": "exited",
            "Labels": engine.created[0]["Labels"] | {"io.gpuenv.pid": "1"},
        }
    ]
    for _ in range(2):  # every later command sees it until it is removed: one end
        assert reap(engine, UsageLog(state)) == []
    (run,) = UsageLog(state).runs()
    assert (run.state, run.end, run.exit) == ("ended", FINISHED, 5)
    assert [json.loads(line)["event"] for line in path.read_text().splitlines()] == [
        "start",
        "end",
    ]


def test_removing_a_detached_run_records_its_end(tmp_path: Path) -> None:
    from gpuenv.containers.detached import remove_run
    from gpuenv.monitoring.monitor import RunInfo

    engine, state, _ = _detached(tmp_path)
    engine.exit("c1")
    info = RunInfo("c1", "d", "proj", "alice", os.getuid(), "0", "", "", "", "exited", None, True)
    remove_run(engine, info, UsageLog(state).finish_for)
    assert ("remove", ("c1",)) in engine.calls
    (run,) = UsageLog(state).runs()
    assert (run.state, run.end, run.exit) == ("ended", FINISHED, 5)
    assert time.time() > FINISHED


def _as_user(uid: int, action: Callable[[], None]) -> str:
    """`action` in a forked child running as `uid`: what it raised ('' for nothing)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's report goes through the pipe
        os.close(read)
        text = ""
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            action()
        except BaseException as exc:
            text = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        said = handle.read().decode()
    os.waitpid(child, 0)
    return said


def _expect_own(runs: list[Any]) -> None:
    if [run.uid for run in runs] != [os.getuid()]:
        raise AssertionError(f"read {[run.uid for run in runs]}")


def test_in_the_shared_folder_only_root_creates_usage() -> None:
    import shutil
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="gpuenv-usage-shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)  # like /var/tmp/gpuenv: root-owned and sticky
        said = _as_user(ALICE, lambda: UsageLog(str(shared)).begin("llm", []) and None)
        assert said.startswith("UsageError") and "does not exist, and only root may" in said
        assert not (shared / "usage").exists()
        UsageLog(str(shared)).begin("llm", [])  # root makes it: 1777, root's
        assert (shared / "usage").stat().st_uid == 0
        assert _as_user(ALICE, lambda: UsageLog(str(shared)).begin("llm", []) and None) == ""
        mine = shared / "usage" / f"{ALICE}.jsonl"
        assert mine.stat().st_uid == ALICE and mine.stat().st_mode & 0o777 == 0o600
        # Alice reads her run only; root reads both.
        assert len(UsageLog(str(shared)).runs(uid=0)) == 2
        assert _as_user(ALICE, lambda: _expect_own(UsageLog(str(shared)).runs())) == ""
    finally:
        shutil.rmtree(shared)
