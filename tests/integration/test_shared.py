"""Shared GPU servers: reservations, ps, top, stop and doctor against the real engine,
on a described 4-GPU host (GPUENV_HOST_FILE) with the stand-in NVIDIA hook."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..jsonschemas import validate_output
from .conftest import Installed, Project, docker, gpuenv_failed

pytestmark = pytest.mark.integration

UUIDS = [f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-1111-4000-8000-00000000000{i}" for i in range(4)]


def describe(
    path: Path, processes: dict[int, list[int]] | None = None, load: dict[int, int] | None = None
) -> str:
    gpus = [
        {
            "index": i,
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": UUIDS[i],
            "memory_total_mib": 81920,
            "memory_used_mib": 100,
            "utilization": (load or {}).get(i, 0),
            "temperature_c": 40 + i,
            "power_w": 60.0,
            "power_limit_w": 400.0,
            "processes": [
                {"pid": pid, "used_memory_mib": 512} for pid in (processes or {}).get(i, [])
            ],
        }
        for i in range(4)
    ]
    path.write_text(json.dumps({"driver": "550.54.15", "gpus": gpus}))
    return str(path)


@pytest.fixture
def shared(make_project, tmp_path: Path) -> Project:
    project = make_project(spec="gpus: 1\n")
    project.ok("build", "-q")
    project.env["GPUENV_STATE_DIR"] = str(tmp_path / "state")
    project.env["GPUENV_HOST_FILE"] = describe(tmp_path / "host.json")
    return project


def _popen(project: Project, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuenv.cli", "-C", str(project.path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**project.env, **env},
    )


def _container(project: Project, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = docker(
            "ps", "-q", "--no-trunc", "--filter", f"label=io.gpuenv.project={project.name}"
        ).stdout.split()
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError("no container appeared")


def test_eight_runs_on_four_gpus_never_share_one(shared: Project) -> None:
    script = "echo $NVIDIA_VISIBLE_DEVICES $(date +%s.%N); sleep 2; date +%s.%N"
    processes = [
        _popen(shared, "run", "--gpus", "1", "--wait", "--", "sh", "-c", script) for _ in range(8)
    ]
    spans: dict[str, list[tuple[float, float]]] = {}
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        first, last = out.strip().splitlines()
        device, start = first.split()
        assert device in UUIDS
        spans.setdefault(device, []).append((float(start), float(last)))
    assert sum(len(s) for s in spans.values()) == 8
    for device, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, f"two runs held {device} at once"
    assert len(spans) == 4  # the four GPUs were all used


def test_killed_run_claim_is_reclaimed(shared: Project, tmp_path: Path) -> None:
    first = _popen(shared, "run", "--gpus", "device=0", "--", "sleep", "300")
    _container(shared)
    busy = shared.gpuenv("run", "--gpus", "device=0", "--", "true")
    assert gpuenv_failed(busy, 16)
    assert "GPU 0: held by" in busy.stderr and shared.name in busy.stderr
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    again = shared.ok("run", "--gpus", "device=0", "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES")
    assert again.stdout.strip() == UUIDS[0]
    assert "left behind by a gpuenv run that was killed" in again.stderr


def test_foreign_processes_and_load(shared: Project, tmp_path: Path) -> None:
    # GPU 0 runs something outside gpuenv (this test's own process); GPU 1 is busiest.
    host = describe(tmp_path / "busy.json", processes={0: [os.getpid()]}, load={1: 90, 2: 10, 3: 5})
    result = shared.ok(
        "run",
        "--gpus",
        "2",
        "--",
        "sh",
        "-c",
        "echo $NVIDIA_VISIBLE_DEVICES",
        GPUENV_HOST_FILE=host,
    )
    assert result.stdout.strip() == f"{UUIDS[2]},{UUIDS[3]}"  # not 0 (foreign), not 1 (busiest)
    everything = describe(tmp_path / "full.json", processes={i: [os.getpid()] for i in range(4)})
    refused = shared.gpuenv("run", "--gpus", "1", "--", "true", GPUENV_HOST_FILE=everything)
    assert gpuenv_failed(refused, 16)
    assert "busy with processes outside gpuenv" in refused.stderr
    assert "--wait" in refused.stderr


def test_ps_top_and_stop_show_the_right_run(
    shared: Project, tmp_path: Path, installed_for_users: Installed
) -> None:
    process = _popen(shared, "run", "--gpus", "device=2", "--", "sleep", "300")
    container = _container(shared)
    ps = validate_output("ps", shared.ok("ps", "--json").stdout)
    (run,) = [r for r in ps if r["project"] == shared.name]
    assert run["gpus"] == UUIDS[2] and run["command"] == "sleep 300" and run["id"] == container
    # NVML would list the container's processes by host PID: describe one on GPU 2.
    pid = int(docker("inspect", "-f", "{{.State.Pid}}", container).stdout.strip())
    host = describe(tmp_path / "using.json", processes={2: [pid], 3: [os.getpid()]})
    snapshot = validate_output(
        "top", shared.ok("top", "--once", "--json", GPUENV_HOST_FILE=host).stdout
    )
    rows = {row["index"]: row for row in snapshot["gpus"]}
    (user,) = rows[2]["users"]
    assert (
        user["gpuenv"] is True
        and user["project"] == shared.name
        and user["container"] == container[:12]
    )
    assert rows[2]["claimed_by"]["project"] == shared.name
    assert rows[3]["users"][0]["gpuenv"] is False  # this test process: outside gpuenv
    assert rows[0]["users"] == [] and rows[0]["claimed_by"] is None
    table = shared.ok("top", "--once", GPUENV_HOST_FILE=host, COLUMNS="200").stdout
    assert "outside gpuenv" in table and shared.name in table
    tester = os.environ.get("GPUENV_TEST_USER", "gpuenv-tester")
    if os.getuid() == 0:
        import pwd

        other = pwd.getpwnam(tester)
        refused = subprocess.run(
            installed_for_users.as_user(other, *installed_for_users.argv("stop", run["name"])),
            capture_output=True,
            text=True,
            env=installed_for_users.env({**shared.env, "HOME": other.pw_dir}),
        )
        assert refused.returncode == 2
        assert "only its owner or root can stop it" in refused.stderr
    stopped = shared.ok("stop", run["name"])
    assert "stopped" in stopped.stderr
    process.communicate(timeout=60)
    assert process.returncode in (143, 137)
    assert docker("ps", "-aq", "--filter", f"id={container}").stdout.strip() == ""


def test_top_without_gpus(shared: Project, tmp_path: Path) -> None:
    empty = tmp_path / "none.json"
    empty.write_text('{"driver": null, "gpus": []}')
    result = shared.ok("top", GPUENV_HOST_FILE=str(empty))
    assert "no NVIDIA GPU on this host" in result.stderr


def test_doctor(shared: Project) -> None:
    nogpu = os.environ["GPUENV_TEST_DOCKER_NOGPU"]
    ok = shared.ok("doctor", "--json")
    checks = {c["name"]: c for c in validate_output("doctor", ok.stdout)}
    assert checks["NVIDIA runtime"]["status"] == "ok"
    assert checks["Docker engine"]["status"] == "ok"
    assert checks["gpuenv.lock"]["status"] == "ok"
    failing = shared.gpuenv("doctor", DOCKER_HOST=nogpu)
    if "not checked: the engine has no image" in failing.stdout:
        pytest.fail("the no-hook engine has no image to probe with")
    assert failing.returncode == 15
    assert "fail NVIDIA runtime" in failing.stdout
    assert "NVIDIA Container Toolkit" in failing.stdout
    unreachable = shared.gpuenv("doctor", DOCKER_HOST="unix:///tmp/gpuenv-none.sock")
    assert unreachable.returncode == 15 and "cannot reach the Docker engine" in unreachable.stdout


NASTY = "[/][link=file:///etc/passwd]x[/link]\x1b[2J\u202etxt"


def test_another_users_text_never_breaks_ps(
    shared: Project, tmp_path: Path, installed_for_users: Installed
) -> None:
    """Issue 33, item 2: a run whose command holds markup, a terminal escape and a BiDi
    override; another user's `ps` (root's `top`) shows it escaped, exits 0, and sends none
    of it to the terminal."""
    process = _popen(shared, "run", "--gpus", "device=1", "--", "sh", "-c", "sleep 300", NASTY)
    container = _container(shared)
    try:
        if os.getuid() == 0:
            import pwd

            other = pwd.getpwnam(os.environ.get("GPUENV_TEST_USER", "gpuenv-tester"))
            # The other user's own view: this test's host file and state folder are root's.
            env = {k: v for k, v in shared.env.items() if k not in ("GPUENV_HOST_FILE",)}
            env.update(HOME=other.pw_dir, GPUENV_STATE_DIR=str(tmp_path / "other-state"))

            def ps(*args: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    installed_for_users.as_user(other, *installed_for_users.argv("ps", *args)),
                    capture_output=True,
                    text=True,
                    env=installed_for_users.env(env),
                )
        else:

            def ps(*args: str) -> subprocess.CompletedProcess[str]:
                return shared.gpuenv("ps", *args)

        table, data = ps(), ps("--json")
        assert table.returncode == 0 and data.returncode == 0, table.stderr + data.stderr
        assert "[/][link=file:///etc/passwd]x[/link]\\x1b[2J\\u202etxt" in table.stdout
        assert "\x1b" not in table.stdout + table.stderr and "\u202e" not in table.stdout
        (run,) = [r for r in json.loads(data.stdout) if r["id"] == container]
        assert run["command"] == f"sh -c 'sleep 300' '{NASTY}'" or NASTY in run["command"]
        top = shared.ok("top", "--once", COLUMNS="250")
        assert "\x1b" not in top.stdout and "\u202e" not in top.stdout
    finally:
        shared.ok("stop", container[:12])
        process.communicate(timeout=60)
