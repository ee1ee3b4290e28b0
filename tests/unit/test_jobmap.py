"""dcgm-exporter's HPC job mapping kept from the claims (gpuenv/reservations/jobmap.py): the
content, the setting, and the files' lifecycle with a real claims store whose holders
are real processes (one SIGKILLed); the host's GPUs come from a host file
(GPUENV_HOST_FILE), as `detect_host` reads it."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import socket
import stat
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from gpuenv.common.versions import DriverVersion
from gpuenv.host.detect import detect_host
from gpuenv.host.machine import Gpu, Host, MigDevice
from gpuenv.reservations.claims import Claim, ClaimStore
from gpuenv.reservations.gpus import parse_gpus_option
from gpuenv.reservations.jobmap import (
    JOB_MAP_ENV,
    MAX_LINES,
    SLOT,
    job_id,
    mapping,
    mapping_dir,
    open_job_map,
    slots,
)
from gpuenv.reservations.reserve import reserve
from gpuenv.reservations.statedir import hold, locked, open_state, owner_name

HOST = socket.gethostname()
# dcgm-exporter's validGPUFile, as hpc.go (d5e5f51) writes it: the names it reads.
DCGM_NAME = re.compile(r"^\d+(\.\d+)?$")


def claim(
    gpu: str,
    *,
    user: str = "alice",
    pid: int = 7,
    host: str = HOST,
    project: str = "demo",
    container: str = "",
) -> Claim:
    return Claim(gpu, user, 1000, pid, "1", host, project, 0.0, container)


# This host's GPUs as `slots` names them: GPU-a is GPU 0, GPU-b GPU 1 (also claimed by
# its index where UUIDs are unknown), MIG-a GPU instance 3 of GPU 2.
NAMES = {"GPU-a": "0", "0": "0", "GPU-b": "1", "1": "1", "GPU-c": "2", "2": "2", "MIG-a": "2.3"}


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ([], {}),
        ([claim("GPU-a")], {"0": "alice/demo/pid-7\n"}),
        (  # two runs on one GPU: two lines, one label value each
            [claim("GPU-b", pid=9), claim("GPU-b", user="bob", project="x")],
            {"1": "alice/demo/pid-9\nbob/x/pid-7\n"},
        ),
        ([claim("GPU-a"), claim("GPU-a")], {"0": "alice/demo/pid-7\n"}),  # one line per run
        ([claim("MIG-a")], {"2.3": "alice/demo/pid-7\n"}),  # <GPU>.<GPU instance>
        ([claim("1")], {"1": "alice/demo/pid-7\n"}),  # an index claim: that GPU's file
        ([claim("GPU-z")], {}),  # a GPU this host does not list: left out, never guessed
        ([claim("7")], {}),  # nor an index it does not have
        ([claim("GPU-a", host="elsewhere")], {}),  # another host's claims are not ours
        ([claim("GPU-a", container="6524a7dd9d44ffff")], {"0": "alice/demo/6524a7dd9d44\n"}),
        (  # a project cannot add a line, or a label value with odd characters
            [claim("GPU-a", project="p\nq/r s")],
            {"0": "alice/p_q_r_s/pid-7\n"},
        ),
    ],
)
def test_mapping(claims: list[Claim], expected: dict[str, str]) -> None:
    assert mapping(claims, HOST, NAMES) == expected
    assert all(DCGM_NAME.match(name) for name in expected)


def test_a_file_lists_at_most_max_lines_and_every_user_first() -> None:
    flood = [claim("GPU-a", user="mallory", pid=pid) for pid in range(100, 140)]
    alice = claim("GPU-a", user="alice", pid=5)
    lines = mapping([*flood, alice], HOST, NAMES)["0"].splitlines()
    assert len(lines) == MAX_LINES == 16
    assert "alice/demo/pid-5" in lines  # mallory's 40 claims do not push alice's run out


def test_slots_name_gpus_and_mig_instances_as_dcgm_does() -> None:
    migs = (MigDevice("MIG-a", gpu_instance=1), MigDevice("MIG-b", gpu_instance=None))
    host = Host(
        DriverVersion.parse("550"),
        (Gpu(0, "A100", "GPU-0"), Gpu(1, "A100", "GPU-1", mig_devices=migs)),
    )
    assert slots(host) == {"GPU-0": "0", "0": "0", "GPU-1": "1", "1": "1", "MIG-a": "1.1"}
    assert SLOT.pattern == DCGM_NAME.pattern.strip("^$")


def test_job_id_is_one_safe_line() -> None:
    assert job_id(claim("GPU-a", user="al ice", project="x" * 100)) == f"al_ice/{'x' * 64}/pid-7"


def test_the_setting(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    env = {"GPUENV_SYSTEM_CONFIG": str(config)}
    assert mapping_dir(env)[0] == ""
    config.write_text('[dcgm_exporter]\njob_mapping_dir = "/run/jobs"\n')
    config.chmod(0o644)
    assert mapping_dir(env) == ("/run/jobs", f"{config} [dcgm_exporter] job_mapping_dir")
    assert mapping_dir({**env, JOB_MAP_ENV: "/other"}) == ("/other", JOB_MAP_ENV)
    config.chmod(0o666)  # anyone could point it elsewhere: not read
    assert mapping_dir(env)[0] == ""


def test_an_unsafe_or_missing_folder_is_a_problem_not_a_failure(tmp_path: Path) -> None:
    assert open_job_map({JOB_MAP_ENV: str(tmp_path / "none")})[1].endswith("is not kept")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    folder, problem = open_job_map({JOB_MAP_ENV: str(shared)})
    assert folder is None and "other users could rewrite" in problem
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    folder, problem = open_job_map({JOB_MAP_ENV: str(link)})
    assert folder is None and "symbolic link" in problem


HOST4 = Host(
    DriverVersion.parse("550.54.15"),
    (
        Gpu(0, "A100", "GPU-0"),
        Gpu(1, "A100", "GPU-1"),
        Gpu(2, "A100", "GPU-2", mig_mode=True, mig_devices=(MigDevice("MIG-2a", 5),)),
    ),
)
HOST4_FILE = {
    "driver": "550.54.15",
    "gpus": [
        {"index": 0, "name": "A100", "uuid": "GPU-0"},
        {"index": 1, "name": "A100", "uuid": "GPU-1"},
        {
            "index": 2,
            "name": "A100",
            "uuid": "GPU-2",
            "mig": [{"uuid": "MIG-2a", "gpu_instance": 5}],
        },
    ],
}


@pytest.fixture(autouse=True)
def _host4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This host, for the store that keeps the mapping: HOST4, through a host file."""
    described = tmp_path / "host.json"
    described.write_text(json.dumps(HOST4_FILE))
    monkeypatch.setenv("GPUENV_HOST_FILE", str(described))
    assert slots(detect_host()) == slots(HOST4)


def test_another_users_folder_is_a_problem_roots_is_not_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    if os.getuid() == 0:
        os.chown(theirs, 4343, -1)  # an ordinary user's folder
    owner = theirs.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)  # gpuenv run by another user
    folder, problem = open_job_map({JOB_MAP_ENV: str(theirs)})
    assert folder is None and "belongs to" in problem and problem.endswith("is not kept")
    assert open_job_map({JOB_MAP_ENV: "/"}) == (None, "")  # root's: kept by root's gpuenv


def _store(tmp_path: Path) -> ClaimStore:
    jobs = tmp_path / "jobs"
    jobs.mkdir(exist_ok=True)
    jobs.chmod(0o755)
    return ClaimStore(str(tmp_path / "state"), env={JOB_MAP_ENV: str(jobs)})


def _files(tmp_path: Path) -> dict[str, str]:
    """What dcgm-exporter would read: the GPU files, each a plain file it may read."""
    out = {}
    for path in (tmp_path / "jobs").iterdir():
        if DCGM_NAME.match(path.name):
            info = path.lstat()
            assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o644
            out[path.name] = path.read_text()
    return out


def _plant(store: ClaimStore, name: str, **fields: object) -> int:
    """A live claim written by hand, as any local user can: this process holds it (the
    descriptor returned) and the file says what `fields` say."""
    me = os.getuid()
    data = {
        "gpu": "GPU-0",
        "user": _user(),
        "uid": me,
        "pid": os.getpid(),
        "pid_start": "1",
        "host": HOST,
        "project": "forged",
        "since": time.time(),
        "container": "",
        **fields,
    }
    fd = os.open(os.path.join(store.directory, f"claim.{name}.json"), os.O_RDWR | os.O_CREAT, 0o644)
    hold(fd)
    os.write(fd, json.dumps(data).encode())
    return fd


def test_a_claim_cannot_choose_its_file_or_gpu(tmp_path: Path) -> None:
    store = _store(tmp_path)
    planted = [
        _plant(store, "a", slot="1", pid=101),  # GPU 0's claim that names GPU 1's file
        _plant(store, "b", gpu="GPU-9", slot="2", pid=102),  # a GPU this host lacks
        _plant(store, "c", gpu="7", pid=103),  # an index this host lacks
    ]
    try:
        assert len(store.claims()) == 3  # live claims, all of them
        assert _files(tmp_path) == {"0": f"{_user()}/forged/pid-101\n"}
    finally:
        for fd in planted:
            os.close(fd)


def test_many_claims_fill_a_file_up_to_the_cap(tmp_path: Path) -> None:
    store = _store(tmp_path)
    planted = [_plant(store, str(pid), pid=pid) for pid in range(1000, 1040)]
    try:
        store.claims()
        lines = _files(tmp_path)["0"].splitlines()
        assert len(lines) == MAX_LINES and len(set(lines)) == MAX_LINES
    finally:
        for fd in planted:
            os.close(fd)


def _lock_holder(directory: str, pipe: Connection) -> None:
    """Another gpuenv process (`idle --enforce` stopping a container) holding the lock."""
    with locked(open_state(None, directory), 10):
        pipe.send("locked")
        pipe.recv()


def test_a_busy_lock_never_delays_reading_or_releasing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _, names = reserve(store, parse_gpus_option("device=0"), HOST4, "demo", None, print)
    job = f"{_user()}/demo/pid-{os.getpid()}"
    ours, theirs = multiprocessing.Pipe()
    holder = multiprocessing.get_context("fork").Process(
        target=_lock_holder, args=(store.directory, theirs)
    )
    holder.start()
    try:
        assert ours.poll(30) and ours.recv() == "locked"
        start = time.monotonic()
        assert [c.gpu for c in store.claims()] == ["GPU-0"]
        store.release(names)
        assert store.claims() == []
        assert time.monotonic() - start < 1.0  # not GPUENV_LOCK_TIMEOUT's 10 s
        assert _files(tmp_path) == {"0": f"{job}\n"}  # not kept meanwhile: the lock is busy
        assert store.job_map_problems == []  # a busy lock is no problem
        ours.send("done")
        holder.join(10)
        assert store.claims() == []
        assert _files(tmp_path) == {}  # the next reader caught up
    finally:
        if holder.is_alive():
            holder.kill()


def test_claim_and_release_keep_the_files(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _, names = reserve(store, parse_gpus_option("device=1"), HOST4, "demo", None, print)
    job = f"{_user()}/demo/pid-{os.getpid()}"
    assert _files(tmp_path) == {"1": f"{job}\n"}
    _, more = reserve(store, parse_gpus_option("MIG-2a"), HOST4, "demo", None, print)
    assert _files(tmp_path) == {"1": f"{job}\n", "2.5": f"{job}\n"}
    store.release(names)
    assert _files(tmp_path) == {"2.5": f"{job}\n"}
    store.release(more)
    assert _files(tmp_path) == {}
    assert not [p for p in (tmp_path / "jobs").iterdir()]  # no temporary file left behind


def test_a_detached_runs_container_takes_over_the_line(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _, names = reserve(store, parse_gpus_option("device=0"), HOST4, "demo", None, print)
    with store.locked():
        store.transfer(names, "6524a7dd9d44" + "0" * 52)
    assert _files(tmp_path) == {"0": f"{_user()}/demo/6524a7dd9d44\n"}


def test_a_link_planted_as_a_gpu_file_is_replaced_not_followed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    target = tmp_path / "precious"
    target.write_text("keep\n")
    (tmp_path / "jobs" / "0").symlink_to(target)
    reserve(store, parse_gpus_option("device=0"), HOST4, "demo", None, print)
    assert target.read_text() == "keep\n"
    assert _files(tmp_path) == {"0": f"{_user()}/demo/pid-{os.getpid()}\n"}


def _holder(directory: str, jobs: str, gpu: str, pipe: Connection) -> None:
    """A run's gpuenv process: claims a GPU and holds it until it is killed."""
    store = ClaimStore(directory, env={JOB_MAP_ENV: jobs})
    reserve(store, parse_gpus_option(gpu), HOST4, "victim", None, lambda _: None)
    pipe.send(os.getpid())
    time.sleep(600)


@pytest.mark.parametrize("looker", ["next claim", "top"])
def test_a_sigkilled_holder_is_reaped_from_the_files(tmp_path: Path, looker: str) -> None:
    store = _store(tmp_path)
    ours, theirs = multiprocessing.Pipe()
    holder = multiprocessing.get_context("fork").Process(
        target=_holder, args=(store.directory, str(tmp_path / "jobs"), "device=0", theirs)
    )
    holder.start()
    try:
        assert ours.poll(30), "the holder never claimed its GPU"
        pid = ours.recv()
        assert _files(tmp_path) == {"0": f"{_user()}/victim/pid-{pid}\n"}
        os.kill(pid, signal.SIGKILL)
        holder.join(10)
        assert _files(tmp_path) == {"0": f"{_user()}/victim/pid-{pid}\n"}  # nobody looked yet
        # Whoever looks next finds the holder dead (the kernel dropped its lock): reaped.
        if looker == "top":
            assert store.claims() == []
            assert _files(tmp_path) == {}
        else:
            reserve(store, parse_gpus_option("device=1"), HOST4, "next", None, print)
            assert _files(tmp_path) == {"1": f"{_user()}/next/pid-{os.getpid()}\n"}
    finally:
        if holder.is_alive():
            holder.kill()


def _user() -> str:
    return owner_name(os.getuid())
