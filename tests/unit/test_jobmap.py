"""dcgm-exporter's HPC job mapping kept from the claims (gpuenv/sharing/jobmap.py): the
content, the setting, and the files' lifecycle with a real claims store whose holders
are real processes (one SIGKILLed)."""

from __future__ import annotations

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

from gpuenv.host.machine import Gpu, Host, MigDevice
from gpuenv.sharing.claims import Claim, ClaimStore
from gpuenv.sharing.gpus import parse_gpus_option
from gpuenv.sharing.jobmap import (
    JOB_MAP_ENV,
    SLOT,
    job_id,
    mapping,
    mapping_dir,
    open_job_map,
    slots,
)
from gpuenv.sharing.reserve import reserve
from gpuenv.sharing.statedir import owner_name

HOST = socket.gethostname()
# dcgm-exporter's validGPUFile, as hpc.go (d5e5f51) writes it: the names it reads.
DCGM_NAME = re.compile(r"^\d+(\.\d+)?$")


def claim(
    gpu: str,
    slot: str = "",
    *,
    user: str = "alice",
    pid: int = 7,
    host: str = HOST,
    project: str = "demo",
    container: str = "",
) -> Claim:
    return Claim(gpu, user, 1000, pid, "1", host, project, 0.0, container, slot)


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ([], {}),
        ([claim("GPU-a", "0")], {"0": "alice/demo/pid-7\n"}),
        (  # two runs on one GPU: two lines, one label value each
            [claim("GPU-a", "1", pid=9), claim("GPU-a", "1", user="bob", project="x")],
            {"1": "alice/demo/pid-9\nbob/x/pid-7\n"},
        ),
        ([claim("MIG-a", "2.3")], {"2.3": "alice/demo/pid-7\n"}),  # <GPU>.<GPU instance>
        ([claim("3")], {"3": "alice/demo/pid-7\n"}),  # an index claim names its file itself
        ([claim("GPU-a")], {}),  # no slot known: left out, never guessed
        ([claim("GPU-a", "0", host="elsewhere")], {}),  # another host's GPU 0 is not ours
        ([claim("GPU-a", "../0")], {}),  # a slot that is not a GPU name is ignored
        ([claim("GPU-a", "0", container="6524a7dd9d44ffff")], {"0": "alice/demo/6524a7dd9d44\n"}),
        (  # a project cannot add a line, or a label value with odd characters
            [claim("GPU-a", "0", project="p\nq/r s")],
            {"0": "alice/p_q_r_s/pid-7\n"},
        ),
    ],
)
def test_mapping(claims: list[Claim], expected: dict[str, str]) -> None:
    assert mapping(claims, HOST) == expected
    assert all(DCGM_NAME.match(name) for name in expected)


def test_slots_name_gpus_and_mig_instances_as_dcgm_does() -> None:
    migs = (MigDevice("MIG-a", gpu_instance=1), MigDevice("MIG-b", gpu_instance=None))
    host = Host("550", (Gpu(0, "A100", "GPU-0"), Gpu(1, "A100", "GPU-1", mig_devices=migs)))
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


HOST4 = Host(
    "550.54.15",
    (
        Gpu(0, "A100", "GPU-0"),
        Gpu(1, "A100", "GPU-1"),
        Gpu(2, "A100", "GPU-2", mig_mode=True, mig_devices=(MigDevice("MIG-2a", 5),)),
    ),
)


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
