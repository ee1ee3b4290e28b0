"""The scripts of `gpuenv submit --launcher apptainer|pyxis` and `--nodes N` run on the
real test Slurm: Apptainer and pyxis/enroot as stand-in executables (tests/integration/
standins: they check their arguments, pull by digest from the registry and run the
command with the image's Python), and a real c10d rendezvous of CPU torch between two
Slurm nodes in two network namespaces (the gpuenv-multi cluster of scripts/services.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv.lock.lockfile import write_lock
from gpuenv.lock.project import load_project

from .conftest import _missing, registry_digest, wait_for_job
from .test_cluster import OtherUser, tester

__all__ = ["tester"]  # the fixture, shared with test_cluster.py

pytestmark = pytest.mark.integration

STANDINS = Path(__file__).parent / "standins"
DDP = """\
import fcntl, os, socket, struct
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
link = os.environ.get("GLOO_SOCKET_IFNAME", "")
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
request = struct.pack("256s", link.encode())
address = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), 0x8915, request)[20:24])  # SIOCGIFADDR
with open(f"rank-{rank}.txt", "w") as out:
    out.write(f"{rank} {world} {int(total.item())} {os.environ['GROUP_RANK']} {link} {address}\\n")
dist.destroy_process_group()
"""


@pytest.fixture
def standins(tester: OtherUser) -> Iterator[Path]:
    """The stand-in executables in a folder the test user can read, with a log of their
    calls and caches that user owns."""
    state = os.environ.get("GPUENV_TEST_STATE", "/var/lib/gpuenv-test")
    folder = Path(tempfile.mkdtemp(prefix="gpuenv-standins-", dir=state))
    shutil.copy(STANDINS / "containers.py", folder / "containers.py")
    for tool in ("apptainer", "enroot", "srun"):
        (folder / tool).symlink_to("containers.py")
    work = folder / "work"
    work.mkdir()
    for path in (folder, folder / "containers.py"):
        path.chmod(0o755)
    os.chown(work, tester.user.pw_uid, tester.user.pw_gid)
    tester.project.env.update(
        PATH=f"{folder}:{os.environ['PATH']}",
        GPUENV_SIF_CACHE=str(work / "sif"),
        GPUENV_TEST_STANDIN_LOG=str(work / "calls.jsonl"),
        GPUENV_TEST_ENROOT_CACHE=str(work / "enroot"),
        ENROOT_ALLOW_HTTP="1",  # enroot's own setting for a registry without TLS
    )
    try:
        yield work
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def calls(work: Path, tool: str) -> list[list[str]]:
    path = work / "calls.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry["argv"] for entry in map(json.loads, lines) if entry["tool"] == tool]


def logs(project_path: Path, job: str) -> tuple[str, str]:
    folder = project_path / ".gpuenv" / "slurm"
    (out,) = folder.glob(f"*-{job}.out")
    (err,) = folder.glob(f"*-{job}.err")
    return out.read_text(), err.read_text()


def test_apptainer_pulls_once_by_digest_and_runs_on_the_granted_gpus(
    tester: OtherUser, standins: Path, registry: str
) -> None:
    project, user = tester.project, tester.user
    pushed = tester.run("push", f"{registry}/itest/{project.name}")
    assert pushed.returncode == 0, pushed.stderr
    image = pushed.stdout.strip()
    jobs = []
    for _ in range(2):
        submitted = tester.run("submit", "--launcher", "apptainer", "job.py", "0")
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()
        fields = wait_for_job(job, timeout=300)
        assert fields["JobState"] == "COMPLETED", (fields, logs(project.path, job))
        jobs.append(job)
        out, _ = logs(project.path, job)
        visible, slurm = out.split()[1], out.split()[3]
        assert visible == slurm and len(slurm.split(",")) == 2
        result = project.path / f"result-{job}.txt"
        assert result.read_text() == "done\n"
        assert (result.stat().st_uid, result.stat().st_gid) == (user.pw_uid, user.pw_gid)
    pulls = calls(standins, "apptainer")
    pulled = [argv for argv in pulls if argv[0] == "pull"]
    assert len(pulled) == 1, pulls  # the second job reused the SIF
    assert pulled[0][-1] == f"docker://{image}" and "--no-https" in pulled[0]
    digest = image.split("@")[1]
    assert (standins / "sif" / f"{digest.replace(':', '-')}.sif").is_file()
    execs = [argv for argv in pulls if argv[0] == "exec"]
    assert len(execs) == 2 and all("--nv" in argv and "--cleanenv" in argv for argv in execs)
    assert f"{project.path}:/workspace" in execs[0]

    listed = tester.run("jobs")
    assert listed.returncode == 0, listed.stderr
    assert "jobs that ended are not shown" in listed.stderr
    assert "keeps no Slurm accounting" in listed.stderr


def test_apptainer_missing_on_the_node_says_so(tester: OtherUser, registry: str) -> None:
    project = tester.project
    assert tester.run("push", f"{registry}/itest/{project.name}").returncode == 0
    submitted = tester.run("submit", "--launcher", "apptainer", "--gpus", "0", "job.py", "0")
    job = submitted.stdout.strip()
    fields = wait_for_job(job)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "127:0"
    _, err = logs(project.path, job)
    assert "gpuenv: apptainer is not on PATH on" in err


def test_pyxis_imports_the_digest_enroot_parses(
    tester: OtherUser, standins: Path, registry: str
) -> None:
    project = tester.project
    pushed = tester.run("push", f"{registry}/itest/{project.name}")
    assert pushed.returncode == 0, pushed.stderr
    repository, digest = pushed.stdout.strip().split("@")
    submitted = tester.run("submit", "--launcher", "pyxis", "job.py", "0")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    fields = wait_for_job(job, timeout=300)
    assert fields["JobState"] == "COMPLETED", (fields, logs(project.path, job))
    assert (project.path / f"result-{job}.txt").read_text() == "done\n"
    (imported,) = [argv for argv in calls(standins, "enroot") if argv[0] == "import"]
    registry_host, _, repo = repository.partition("/")
    assert imported[-1] == f"docker://{registry_host}#{repo}:{digest}"


def multi_cluster(tester: OtherUser) -> list[str]:
    """The launcher prefix for the gpuenv-multi cluster: its controller is reached from
    the network namespace of its first node."""
    netns = os.environ.get("GPUENV_TEST_MULTI_NETNS", "")
    conf = os.environ.get("GPUENV_TEST_MULTI_SLURM_CONF", "")
    if not netns or not os.path.exists(netns) or not os.path.exists(conf):
        _missing(f"no gpuenv-multi Slurm cluster (GPUENV_TEST_MULTI_NETNS={netns!r})")
    tester.project.env["SLURM_CONF"] = conf
    return ["nsenter", f"--net={netns}"]


def run_on(prefix: list[str], tester: OtherUser, *args: str) -> subprocess.CompletedProcess[str]:
    gpuenv = tester.installed.argv("-C", str(tester.project.path), *args)
    return subprocess.run(
        [*prefix, *tester.installed.as_user(tester.user, *gpuenv)],
        capture_output=True,
        text=True,
        env=tester.installed.env(tester.project.env),
        timeout=300,
    )


def wait_on(prefix: list[str], job: str, timeout: float) -> dict[str, str]:
    """wait_for_job on the gpuenv-multi cluster."""
    conf = os.environ["GPUENV_TEST_MULTI_SLURM_CONF"]
    return wait_for_job(job, timeout, prefix=prefix, conf=conf)


@pytest.fixture
def torch_project(tester: OtherUser, standins: Path, registry: str) -> OtherUser:
    """The project with the torch stand-in as its pushed image (what `gpuenv push` of a
    project on an NGC PyTorch base records), and a DDP job."""
    reference = os.environ.get("GPUENV_TEST_TORCH_IMAGE", "")
    repository, _, tag = reference.rpartition(":")
    if not reference.startswith(f"{registry}/"):
        _missing(f"no torch stand-in image (GPUENV_TEST_TORCH_IMAGE={reference!r})")
    digest = registry_digest(registry, repository.split("/", 1)[1], tag)
    project = load_project(str(tester.project.path))
    pushed = {"reference": reference, "digest": digest, "image": f"{repository}@{digest}"}
    write_lock(
        project.lock_path, replace(project.lock, extra={**project.lock.extra, "pushed": pushed})
    )
    lock_path = Path(project.lock_path)
    tester.project.write("ddp.py", DDP)
    for path in (lock_path, tester.project.path / "ddp.py"):
        os.chown(path, tester.user.pw_uid, tester.user.pw_gid)
    return tester


def test_two_nodes_form_a_c10d_rendezvous(torch_project: OtherUser, standins: Path) -> None:
    prefix = multi_cluster(torch_project)
    project = torch_project.project
    args = ["submit", "--launcher", "apptainer", "--nodes", "2", "--gpus", "2"]
    script = run_on(prefix, torch_project, *args, "--dry-run", "ddp.py").stdout
    assert "#SBATCH --nodes=2" in script and "--rdzv-backend=c10d" in script
    submitted = run_on(prefix, torch_project, *args, "ddp.py")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    fields = wait_on(prefix, job, timeout=420)
    assert fields["JobState"] == "COMPLETED", (fields, logs(project.path, job))
    # Four ranks (two per node: the GPUs Slurm granted each), one sum over all of them,
    # and Gloo on the link between the nodes, from each node's own address on it.
    assert ranks(project.path, 4) == [
        [str(r), "4", "6", str(r // 2), "gpuenv0", f"10.77.0.{r // 2 + 1}"] for r in range(4)
    ]


def ranks(folder: Path, count: int) -> list[list[str]]:
    return sorted(
        ((folder / f"rank-{r}.txt").read_text().split() for r in range(count)),
        key=lambda row: int(row[0]),
    )


def test_two_nodes_with_pyxis(torch_project: OtherUser, standins: Path) -> None:
    """pyxis's torchrun line runs in the container; NCCL and Gloo are told the link by
    -e, as the docs say (the same name on every node)."""
    prefix = multi_cluster(torch_project)
    project = torch_project.project
    submitted = run_on(
        prefix,
        torch_project,
        *("submit", "--launcher", "pyxis", "--nodes", "2", "--gpus", "1"),
        *("-e", "GLOO_SOCKET_IFNAME=gpuenv0", "ddp.py"),
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    fields = wait_on(prefix, job, timeout=420)
    assert fields["JobState"] == "COMPLETED", logs(project.path, job)[1][-6000:]
    assert ranks(project.path, 2) == [
        [str(r), "2", "1", str(r), "gpuenv0", f"10.77.0.{r + 1}"] for r in range(2)
    ]
    imported = [argv[-1] for argv in calls(standins, "enroot") if argv[0] == "import"]
    assert len(imported) == 2 and all("#gpuenv-test/pytorch-cpu:sha256:" in u for u in imported)


def test_a_rendezvous_that_cannot_form_fails_within_the_timeout(
    torch_project: OtherUser, standins: Path
) -> None:
    prefix = multi_cluster(torch_project)
    project = torch_project.project
    project.env["GPUENV_TEST_STANDIN_HANG"] = "mn2"  # mn2's container never starts
    started = time.monotonic()
    submitted = run_on(
        prefix,
        torch_project,
        *("submit", "--launcher", "apptainer", "--nodes", "2", "--gpus", "0"),
        *("--rendezvous-timeout", "8", "ddp.py"),
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    fields = wait_on(prefix, job, timeout=300)
    took = time.monotonic() - started
    _, err = logs(project.path, job)
    assert fields["JobState"] == "FAILED", (fields, err[-3000:])
    assert "RendezvousTimeoutError" in err
    assert "not every node joined the rendezvous" in err and "within 8s" in err
    # The first SIF pull and torch's start count too: within the timeout plus those.
    assert took < 8 + 240, took
